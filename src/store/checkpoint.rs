//! Copying SQLite's write-ahead log back into the database, and starting it over.
//!
//! SQLite's own checkpoint is off (`wal_autocheckpoint = 0`): it would run inside whichever
//! commit crossed its threshold, a webhook's. Instead a task copies the log back every
//! 250 ms, as far as readers allow and without waiting for anyone (`PASSIVE`), on a connection
//! of its own from a blocking thread.
//!
//! That alone never starts the log over under a load with no pause. SQLite starts it over
//! only when a writer finds it wholly copied back, and with commits arriving all the time one
//! always lands while the copy runs: in the intake benchmark the log grew to 466 MB and was
//! reset only when the load stopped. A log that only grows also costs every commit more: on
//! ext4 an fsync of a file that grew commits the filesystem's journal too, about twice the
//! cost of one of a file written over in place. So once the log holds [`RESTART_AT`] frames,
//! a round copies what it can as usual, and again until little came meanwhile, then takes the
//! write turn (intake and every other writer wait), copies the last few frames and starts the
//! log over (`RESTART`), waiting for readers at most [`READERS_WAIT`]. A reader still busy by
//! then costs only this round's restart; the next round tries again. A log this connection
//! started over and no one wrote since (the load stopped) is left alone: the next writer
//! resets it. One merely found wholly copied is not: a writer resets the log by itself only
//! if no reader is in it just then, which under load is seldom (the log grew to 380 MB when
//! rounds left such logs to the writers). The log's file keeps its size
//! (`journal_size_limit` is above it) and is written over from its start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rusqlite::Connection;

use crate::settings::Synchronous;

/// How often the log is copied back.
const EVERY: Duration = Duration::from_millis(250);

/// Frames in the log (4 KiB pages: 64 MiB) from which a round starts it over. A restart
/// holds intake for the fsync of the last frames copied back, a few milliseconds (measured:
/// 1 to 23 ms, most of it that fsync; waiting for readers, some 20 µs); at 1,000 deliveries
/// a second this comes about once every two and a half seconds.
const RESTART_AT: i64 = 16_384;

/// Frames that may be left to copy while holding the write turn.
const TAIL: i64 = 64;

/// How long a restart waits for readers of the log, holding the write turn, and how often it
/// looks whether they are gone. SQLite's own busy timeout sleeps 1, 2, 5, 10 ms in turn,
/// while a reader here is gone in well under a millisecond.
const READERS_WAIT: Duration = Duration::from_millis(20);
const READERS_LOOK: Duration = Duration::from_micros(100);

/// SQLite's busy handler for this connection: another look after [`READERS_LOOK`], until
/// [`READERS_WAIT`] has passed.
fn readers_busy(looks: i32) -> bool {
    let most = READERS_WAIT.as_micros() / READERS_LOOK.as_micros();
    if u128::try_from(looks).unwrap_or(u128::MAX) >= most {
        return false;
    }
    std::thread::sleep(READERS_LOOK);
    true
}

/// What `PRAGMA wal_checkpoint` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Report {
    /// Could not finish: a reader or writer was in the way.
    busy: bool,
    /// Frames in the log.
    log: i64,
    /// Of those, copied back into the database.
    copied: i64,
}

impl Report {
    /// The checkpoint did not run at all: another connection held it, or it could not read
    /// the log's index just then (a writer was changing it). SQLite then reports -1 frames
    /// in the log and -1 copied.
    fn could_not_run(&self) -> bool {
        self.busy && self.log < 0
    }

    /// Every frame is copied back and no reader kept any from being copied.
    fn all_copied(&self) -> bool {
        !self.busy && self.copied == self.log
    }
}

/// The checkpoints' own connection.
pub(super) struct Checkpoints {
    conn: Connection,
    write_lock: Arc<tokio::sync::Mutex<()>>,
    /// The log's frame count when this connection last started it over, until it falls
    /// below [`RESTART_AT`] (a writer reset it).
    restarted: Option<i64>,
}

impl Checkpoints {
    /// A connection to the database file the pool has already created and migrated, whose
    /// checkpoints fsync as `synchronous` says.
    pub(super) fn open(
        path: &std::path::Path,
        synchronous: Synchronous,
        write_lock: Arc<tokio::sync::Mutex<()>>,
    ) -> anyhow::Result<Self> {
        let conn = super::writer::open(path, synchronous, "checkpoints")?;
        conn.busy_handler(Some(readers_busy))?;
        Ok(Self {
            conn,
            write_lock,
            restarted: None,
        })
    }

    fn checkpoint(&self, mode: &str) -> anyhow::Result<Report> {
        self.conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
                Ok(Report {
                    busy: row.get::<_, i64>(0)? != 0,
                    log: row.get(1)?,
                    copied: row.get(2)?,
                })
            })
            .with_context(|| format!("checkpoint ({mode})"))
    }

    /// One round: copies the log back, and starts it over once it holds [`RESTART_AT`]
    /// frames. Blocks: call it from a thread outside the async runtime.
    fn round(&mut self) -> anyhow::Result<()> {
        let mut report = self.checkpoint("PASSIVE")?;
        if report.log < RESTART_AT {
            self.restarted = None;
            return Ok(());
        }
        if self.restarted == Some(report.log) && report.all_copied() {
            // Started over by the last restart and not written since: the next writer
            // resets it (readers that came since read from the database, not the log).
            return Ok(());
        }
        // What is still to copy when the turn is taken is copied, and fsynced, while intake
        // waits: first copy, without holding anyone, what came while the last copy ran, until
        // that is little.
        for _ in 0..4 {
            let again = self.checkpoint("PASSIVE")?;
            if again.could_not_run() {
                // This copy did nothing and says nothing of what came meanwhile (under a
                // stream of commits it happens: one of them was changing the log's index).
                continue;
            }
            let came = again.log - report.log;
            report = again;
            if came <= TAIL {
                break;
            }
        }
        let started = Instant::now();
        let _turn = self.write_lock.blocking_lock();
        let turn = Instant::now();
        // The last frames, copied and fsynced without waiting for anyone; then the restart,
        // which has nothing left to copy and waits only for readers still in the log.
        let last = self.checkpoint("PASSIVE")?;
        let copied = Instant::now();
        let restart = self.checkpoint("RESTART")?;
        if !restart.busy {
            self.restarted = Some(restart.log);
        }
        tracing::debug!(
            frames = last.log,
            left = last.log - report.copied,
            restarted = !restart.busy,
            waited_us = (turn - started).as_micros(),
            copy_us = (copied - turn).as_micros(),
            restart_us = copied.elapsed().as_micros(),
            held_us = turn.elapsed().as_micros(),
            "write-ahead log: a restart round"
        );
        Ok(())
    }
}

/// What the checkpoint task runs on each tick: [`Checkpoints`] (a stand-in in tests).
pub(super) trait Round: Send + 'static {
    /// One round; blocks.
    fn round(&mut self) -> anyhow::Result<()>;
}

impl Round for Checkpoints {
    fn round(&mut self) -> anyhow::Result<()> {
        Checkpoints::round(self)
    }
}

/// Runs a round of `first` every [`EVERY`] until `stop`. A round that fails is logged (a
/// warning when the round before it did not fail, so that a failure that lasts is seen once,
/// not four times a second) and the next one tries again. A round that panics takes its
/// connection with it: the next tick opens another with `reopen` (and tries again on the
/// following ticks while that fails), so that the log never grows for good behind a bug.
pub(super) fn spawn<R: Round>(
    first: R,
    reopen: impl Fn() -> anyhow::Result<R> + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut current = Some(first);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let done = match current.take().map_or_else(&reopen, Ok) {
                Ok(checkpoints) => {
                    let Some((back, done)) = round_on_thread(checkpoints).await else {
                        failing = true;
                        continue;
                    };
                    current = Some(back);
                    done
                }
                Err(error) => Err(error.context("opening the checkpoints' connection again")),
            };
            if let Err(error) = &done {
                let error = format!("{error:#}");
                if failing {
                    tracing::debug!(error, "checkpoint did not run");
                } else {
                    tracing::warn!(
                        error,
                        "checkpoint did not run; the write-ahead log grows until one does"
                    );
                }
            }
            failing = done.is_err();
        }
    });
}

/// Runs a round on a blocking thread: the connection back with the round's outcome, or
/// `None` when the round panicked and took the connection with it (logged here).
async fn round_on_thread<R: Round>(mut checkpoints: R) -> Option<(R, anyhow::Result<()>)> {
    let round = tokio::task::spawn_blocking(move || {
        let done = checkpoints.round();
        (checkpoints, done)
    })
    .await;
    match round {
        Ok(back) => Some(back),
        Err(error) => {
            tracing::error!(
                %error,
                "a checkpoint round stopped short; its connection is opened again"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Mutex, OnceLock};

    use super::*;

    static PATH: OnceLock<PathBuf> = OnceLock::new();
    static SEEN: Mutex<Option<Report>> = Mutex::new(None);

    /// The restarting connection's busy handler: it holds the checkpoint while it waits, so
    /// the copy made from here cannot run.
    fn copy_meanwhile(_looks: i32) -> bool {
        let mut seen = SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.is_none()
            && let Some(path) = PATH.get()
        {
            let lock = Arc::new(tokio::sync::Mutex::new(()));
            *seen = Checkpoints::open(path, Synchronous::Full, lock)
                .and_then(|other| other.checkpoint("PASSIVE"))
                .ok();
        }
        false
    }

    /// A round that panics on the connection `opened` first, and counts rounds on any other.
    struct Flaky {
        opened: usize,
        rounds: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Round for Flaky {
        fn round(&mut self) -> anyhow::Result<()> {
            assert!(self.opened > 0, "a bug in a checkpoint round");
            self.rounds
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    /// The task outlives a round that panics: the next tick opens another connection and
    /// rounds go on there.
    #[tokio::test]
    async fn a_round_that_panics_is_followed_by_rounds_on_a_connection_opened_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let rounds = Arc::new(AtomicUsize::new(0));
        let opened = Arc::new(AtomicUsize::new(0));
        let first = Flaky {
            opened: 0,
            rounds: Arc::clone(&rounds),
        };
        let reopen = {
            let (rounds, opened) = (Arc::clone(&rounds), Arc::clone(&opened));
            move || {
                Ok(Flaky {
                    opened: opened.fetch_add(1, Ordering::SeqCst) + 1,
                    rounds: Arc::clone(&rounds),
                })
            }
        };
        let stop = tokio_util::sync::CancellationToken::new();
        spawn(first, reopen, stop.clone());
        let deadline = Instant::now() + Duration::from_secs(20);
        while rounds.load(Ordering::SeqCst) < 2 {
            assert!(
                Instant::now() < deadline,
                "no rounds after the panic: {} opened again",
                opened.load(Ordering::SeqCst)
            );
            tokio::time::sleep(EVERY / 4).await;
        }
        stop.cancel();
        assert_eq!(opened.load(Ordering::SeqCst), 1, "opened again once");
    }

    /// A database in write-ahead-log mode with SQLite's own checkpoints off, after `sql`: its
    /// directory (keep it), its path, and the connection that made it.
    fn database_in_a_log(sql: &str) -> (tempfile::TempDir, PathBuf, Connection) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("store.db");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; {sql}"
        ))
        .expect("a database in a write-ahead log");
        (dir, path, conn)
    }

    /// Runs a round on a thread of its own while the write turn is held here for at most
    /// `wait`, then lets the turn go: whether the round ended while the turn was held, its
    /// outcome, and the connection back.
    fn round_beside_the_turn(
        mut checkpoints: Checkpoints,
        wait: Duration,
    ) -> (Checkpoints, bool, Result<(), String>) {
        let lock = Arc::clone(&checkpoints.write_lock);
        let held = lock.try_lock().expect("the turn is free");
        let (done, outcome) = std::sync::mpsc::channel();
        let round = std::thread::spawn(move || {
            let _ = done.send(checkpoints.round().map_err(|e| format!("{e:#}")));
            checkpoints
        });
        let while_held = outcome.recv_timeout(wait);
        drop(held);
        let checkpoints = round.join().expect("the round's thread");
        match while_held {
            Ok(ended) => (checkpoints, true, ended),
            Err(_) => (
                checkpoints,
                false,
                outcome.recv().expect("the round's outcome"),
            ),
        }
    }

    /// A log past the restart mark and wholly copied back is still started over by a round
    /// (under load a reader is nearly always in the log, and a writer resets it only when
    /// none is); once this connection started it over and no one wrote since (the load
    /// stopped), rounds leave the write turn alone, four times a second, and the next write
    /// resets the log.
    #[test]
    fn a_wholly_copied_log_is_started_over_once_then_left_to_the_next_writer() {
        let (_dir, path, writer) = database_in_a_log(&format!(
            "CREATE TABLE t (x);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {})
             INSERT INTO t SELECT zeroblob(3000) FROM n;",
            RESTART_AT + 100
        ));
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let checkpoints =
            Checkpoints::open(&path, Synchronous::Full, lock).expect("the checkpoints' connection");
        let first = checkpoints.checkpoint("PASSIVE").expect("a copy");
        assert!(first.log >= RESTART_AT && first.all_copied(), "{first:?}");

        // Wholly copied, not yet started over: the round waits for the turn to restart it.
        let (checkpoints, without_turn, ended) =
            round_beside_the_turn(checkpoints, Duration::from_millis(300));
        assert!(!without_turn, "the round went on without the write turn");
        assert_eq!(ended, Ok(()));
        assert_eq!(checkpoints.restarted, Some(first.log), "started over");

        // Started over, no write since: the round ends without the turn.
        let (checkpoints, without_turn, ended) =
            round_beside_the_turn(checkpoints, Duration::from_secs(10));
        assert!(without_turn, "the round waited for the write turn");
        assert_eq!(ended, Ok(()));

        writer
            .execute_batch("INSERT INTO t VALUES (1);")
            .expect("a write");
        let after = checkpoints.checkpoint("PASSIVE").expect("a copy");
        assert!(after.log < 10, "the writer started the log over: {after:?}");
    }

    #[test]
    fn a_copy_that_could_not_run_is_told_from_one_that_copied_nothing() {
        let (_dir, path, setup) =
            database_in_a_log("CREATE TABLE t (x); INSERT INTO t VALUES (1);");
        PATH.set(path.clone()).expect("set once");

        // A reader holding a snapshot behind the log's end keeps a restart waiting.
        let reader = Connection::open(&path).expect("open");
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .expect("a read");
        setup
            .execute_batch("INSERT INTO t VALUES (2);")
            .expect("a write");

        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let restarting =
            Checkpoints::open(&path, Synchronous::Full, lock).expect("the checkpoints' connection");
        restarting
            .conn
            .busy_handler(Some(copy_meanwhile))
            .expect("a busy handler");
        let restart = restarting.checkpoint("RESTART").expect("a restart");
        assert!(restart.busy, "the reader kept the restart from finishing");

        let meanwhile = SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .expect("a copy was tried while the restart waited");
        assert!(meanwhile.could_not_run(), "{meanwhile:?}");

        // With the reader still there, a copy runs as far as the reader lets it, and says so.
        let alone = restarting.checkpoint("PASSIVE").expect("a copy");
        assert!(!alone.could_not_run(), "{alone:?}");
        assert!(alone.log > 0 && alone.copied >= 0, "{alone:?}");
    }
}
