//! The outbox and the event store around the state machine: time as an input, stored events
//! that no longer parse, and retention.

use std::sync::Arc;

use director::clock::ManualClock;
use director::domain::{IssueRef, Lifecycle};
use director::event::{Event, RunReport};
use director::startup::Overrides;
use director::store::{Commit, Finished, Lane, NewAction, NewDelivery, Store};

use crate::forge_helpers::{ForgeApp, TRIGGER, WRITER};
use director_testkit::llm::Reply;

#[tokio::test]
async fn a_failed_read_waits_for_its_backoff_on_the_clock_and_runs_when_the_clock_moves() {
    let clock = ManualClock::new(director::clock::now_ms());
    let overrides = Overrides {
        clock: Some(clock.clone()),
        ..Default::default()
    };
    let (t, llm) = ForgeApp::spawn_with_llm_overridden(
        |s| {
            s.preflight.retry_backoff_ms = 600_000;
            s.preflight.max_attempts = 3;
        },
        overrides,
    )
    .await;
    llm.script(vec![Reply::Status(500)]);
    llm.always("Fine.\n\nGO");
    let issue = t.forge.open_issue(&t.repo, "reporter", "Later", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    crate::helpers::wait_until("the first read failed", || async {
        t.record(&issue)
            .await
            .is_some_and(|r| r.preflight.attempts == 1)
    })
    .await;
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("known");
    assert_eq!(record.lifecycle, Lifecycle::Pending);
    assert_eq!(
        record.preflight.not_before_ms,
        Some(clock_now(&clock) + 600_000),
        "the retry waits ten minutes of the director's clock"
    );
    assert_eq!(llm.prompts().len(), 1, "no second read before its time");

    clock.advance(600_000);
    t.app.wait_state(&issue, Lifecycle::Queued).await;
    assert_eq!(llm.prompts().len(), 2);
    // The comment's action is due on the manual clock, now ahead of the system clock that
    // `wait_processed` counts by: wait for the comment itself.
    crate::helpers::wait_until("the GO comment", || async {
        t.preflight_comments(&issue).len() == 1
    })
    .await;
    assert_eq!(t.preflight_comments(&issue).len(), 1);
}

fn clock_now(clock: &Arc<ManualClock>) -> i64 {
    use director::clock::Clock;
    clock.now_ms()
}

#[tokio::test]
async fn a_stored_event_that_no_longer_parses_is_set_aside_and_the_queue_goes_on() {
    let t = ForgeApp::spawn().await;
    let issue = t.forge.open_issue(&t.repo, "reporter", "After", "").await;
    let now = director::clock::now_ms();
    let store = &t.app.store;
    store
        .insert_raw_event("old-1", &issue, 2, r#"{"type":"no_such_event"}"#, now)
        .await
        .expect("insert");
    store
        .insert_raw_event("old-2", &issue, 99, "{}", now)
        .await
        .expect("insert");
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    let dead = store.dead_events().await.expect("query");
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].0, "old-1");
    assert!(dead[0].1.contains("no_such_event"), "{}", dead[0].1);
    assert!(
        dead[1].1.contains("unknown schema version 99"),
        "{}",
        dead[1].1
    );
    t.app
        .wait_for_metric("director_events_set_aside_total 2")
        .await;
}

async fn temp_store(dir: &tempfile::TempDir) -> Store {
    Store::connect(&director::settings::StoreSettings {
        url: format!("sqlite://{}", dir.path().join("r.db").display()),
        ..Default::default()
    })
    .await
    .expect("store")
}

fn exited(issue: &IssueRef, n: u32, at: i64) -> NewDelivery {
    NewDelivery::internal(
        format!("exited:r{n}"),
        issue.clone(),
        Event::Run {
            run_id: crate::helpers::rid(&format!("r{n}")),
            report: RunReport::Exited {
                code: Some(0),
                timed_out: false,
                log: String::new(),
                stopped: None,
                result: None,
                egress_refused: Vec::new(),
            },
        },
        at,
    )
}

#[tokio::test]
async fn retention_prunes_what_is_old_and_done_in_batches_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("dir");
    let store = temp_store(&dir).await;
    let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
    let (old, recent) = (1_000, 9_000_000);
    store
        .insert_raw_event("broken", &issue, 2, "{", old)
        .await
        .expect("insert");
    store
        .insert_deliveries(&(0..5).map(|n| exited(&issue, n, old)).collect::<Vec<_>>())
        .await
        .expect("insert");
    let events = store.next_events(100).await.expect("read");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    // In arrival order: the broken one set aside, three consumed, two left.
    let (consumed, kept) = seqs[1..].split_at(3);
    let broken = events
        .iter()
        .find(|e| e.delivery_id == "broken")
        .expect("stored")
        .seq;
    assert_eq!(broken, seqs[0]);
    let action = |key: &str| NewAction {
        key: key.into(),
        issue: issue.clone(),
        kind: "sync_labels".into(),
        payload: r#"{"kind":"sync_labels"}"#.into(),
        max_attempts: 3,
        not_before_ms: old,
    };
    store
        .commit(
            &Commit {
                consumed: consumed.to_vec(),
                dead: vec![(broken, "does not parse".into())],
                actions: vec![action("done-old"), action("still-due")],
                ..Default::default()
            },
            old,
        )
        .await
        .expect("commit");
    let claimed = store
        .claim_actions("me", Lane::Except("read_preflight"), 1, 60_000, old)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    store
        .record_outcomes(
            &[Finished::Done {
                id: claimed[0].id,
                event: None,
            }],
            old,
        )
        .await
        .expect("done");
    store
        .record_preflight_call(&issue.repo, old)
        .await
        .expect("call");
    store
        .record_preflight_call(&issue.repo, recent)
        .await
        .expect("call");

    // Small batches until nothing is left to prune.
    let mut rounds = 0;
    let mut deleted = 0;
    loop {
        let n = store.prune(recent - 1, 1).await.expect("prune");
        if n == 0 {
            break;
        }
        deleted += n;
        rounds += 1;
    }
    assert_eq!(
        deleted,
        3 + 1 + 1,
        "3 consumed events, 1 finished action, 1 old call"
    );
    assert!(rounds >= 3, "one row per statement per round: {rounds}");
    let left = store.next_events(100).await.expect("read");
    assert_eq!(left.len(), kept.len(), "unconsumed events stay");
    assert_eq!(
        store.dead_events().await.expect("dead").len(),
        1,
        "set-aside events stay"
    );
    let actions = store.actions_of(&issue).await.expect("actions");
    assert_eq!(actions.len(), 1);
    assert_eq!(actions[0].key, "still-due", "due actions stay");
    let window = store
        .preflight_calls_since(&issue.repo, 0)
        .await
        .expect("calls");
    assert_eq!(
        window.total, 1,
        "recent calls stay: the hourly caps count them"
    );
}

/// The SQLite migrations, in order, for databases as older builds left them.
const SQLITE_MIGRATIONS: [&str; 10] = [
    include_str!("../../migrations/sqlite/0001_deliveries_and_issues.sql"),
    include_str!("../../migrations/sqlite/0002_issue_tracking.sql"),
    include_str!("../../migrations/sqlite/0003_preflight.sql"),
    include_str!("../../migrations/sqlite/0004_runs.sql"),
    include_str!("../../migrations/sqlite/0005_outbox.sql"),
    include_str!("../../migrations/sqlite/0006_director_id.sql"),
    include_str!("../../migrations/sqlite/0007_pull_follow_through.sql"),
    include_str!("../../migrations/sqlite/0008_leases.sql"),
    include_str!("../../migrations/sqlite/0009_egress_refusals.sql"),
    include_str!("../../migrations/sqlite/0010_consumer_mark.sql"),
];

/// A new database at `url` with the first `version` migrations applied and recorded, as a
/// build of that time left it; the connection to add its rows with.
async fn database_at(url: &str, version: usize) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().expect("url");
    let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
        .await
        .expect("open");
    sqlx::raw_sql(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL)",
    )
    .execute(&mut conn)
    .await
    .expect("table");
    for (v, sql) in SQLITE_MIGRATIONS[..version].iter().enumerate() {
        sqlx::raw_sql(*sql)
            .execute(&mut conn)
            .await
            .expect("migration");
        sqlx::query("INSERT INTO schema_migrations VALUES (?, 0)")
            .bind(i64::try_from(v + 1).expect("small"))
            .execute(&mut conn)
            .await
            .expect("recorded");
    }
    conn
}

/// A database as round 1 left it: migrations 1 to 4, an issue waiting for its read and a run
/// being launched.
#[tokio::test]
async fn work_in_flight_in_a_database_from_before_the_outbox_is_carried_over() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    {
        let mut conn = database_at(&url, 4).await;
        sqlx::raw_sql(
            "INSERT INTO issues (repo, number, title, state, labels, last_change_ms, lifecycle, trigger_present, trigger_actor, trigger_trusted, preflight) \
             VALUES ('acme/widgets', 1, 'Waiting', 'open', '[\"headless\"]', 1, 'pending', 1, 'alice', 1, '{\"rev\":3,\"handled_command_id\":9}'), \
                    ('acme/widgets', 2, 'Launching', 'open', '[\"headless\"]', 1, 'running', 1, 'alice', 1, '{\"rev\":1,\"verdict\":\"GO\"}'); \
             INSERT INTO runs (id, repo, number, state, branch, created_at_ms) \
             VALUES ('0123456789ab', 'acme/widgets', 2, 'launching', 'director-issue-2-01234567', 1);",
        )
        .execute(&mut conn)
        .await
        .expect("rows");
    }
    let store = Store::connect(&director::settings::StoreSettings {
        url,
        ..Default::default()
    })
    .await
    .expect("migrates");
    let one: IssueRef = "acme/widgets#1".parse().expect("ref");
    let two: IssueRef = "acme/widgets#2".parse().expect("ref");
    let read = store.actions_of(&one).await.expect("actions");
    assert_eq!(read.len(), 1);
    assert_eq!(
        (read[0].key.as_str(), read[0].kind.as_str()),
        ("acme/widgets#1:read:rev3", "read_preflight")
    );
    let start = store.actions_of(&two).await.expect("actions");
    assert_eq!(start[0].key, "acme/widgets#2:start:0123456789ab");
    // The rows are actions this build reads.
    let claimed = store
        .claim_actions("me", Lane::Except("nothing"), 10, 1_000, 10)
        .await
        .expect("claim");
    for c in claimed {
        let action: director::engine::action::Action =
            serde_json::from_str(&c.payload).expect("parses");
        assert!(
            matches!(
                action,
                director::engine::action::Action::ReadPreflight {
                    rev: 3,
                    handled_command_id: 9
                } | director::engine::action::Action::StartRun { .. }
            ),
            "{action:?}"
        );
    }
    let record = store.issue(&one).await.expect("query").expect("known");
    assert_eq!(record.lifecycle, Lifecycle::Pending);
    assert_eq!(record.preflight.verdict, None);
    let run = store
        .run(&crate::helpers::rid("0123456789ab"))
        .await
        .expect("query")
        .expect("known");
    assert_eq!(run.state, director::domain::RunState::Launching);
}

/// A database from before the consumer's mark (migrations 1 to 9), with events consumed, set
/// aside and still waiting: after the upgrade the waiting ones, and only they, are read, and
/// the consumer goes on from there.
#[tokio::test]
async fn events_waiting_in_a_database_from_before_the_consumer_mark_are_still_consumed() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("v9.db").display());
    {
        let mut conn = database_at(&url, 9).await;
        let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
        let json = |n: u32| serde_json::to_string(&exited(&issue, n, 1).event).expect("json");
        for (n, processed, dead) in [
            (0, Some(5), None),
            (1, Some(5), Some("does not parse")),
            (2, None, None),
            (3, None, None),
        ] {
            sqlx::query(
                "INSERT INTO deliveries (delivery_id, content_sha256, event_type, repo, number, \
                 event, received_at_ms, processed_at_ms, schema, dead_reason) \
                 VALUES (?, ?, 'run', 'acme/widgets', 1, ?, 1, ?, 2, ?)",
            )
            .bind(format!("exited:r{n}"))
            .bind(format!("hash-{n}"))
            .bind(json(n))
            .bind(processed)
            .bind(dead)
            .execute(&mut conn)
            .await
            .expect("row");
        }
    }
    let store = Store::connect(&director::settings::StoreSettings {
        url,
        ..Default::default()
    })
    .await
    .expect("migrates");
    let waiting = store.next_events(10).await.expect("read");
    let ids: Vec<&str> = waiting.iter().map(|e| e.delivery_id.as_str()).collect();
    assert_eq!(ids, ["exited:r2", "exited:r3"]);
    assert_eq!(store.pending_deliveries().await.expect("count"), 2);
    assert_eq!(store.dead_events().await.expect("dead").len(), 1);
    store
        .commit(
            &Commit {
                consumed: waiting.iter().map(|e| e.seq).collect(),
                ..Default::default()
            },
            10,
        )
        .await
        .expect("consume");
    let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
    store
        .insert_deliveries(&[exited(&issue, 4, 20)])
        .await
        .expect("insert");
    let next = store.next_events(10).await.expect("read");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].delivery_id, "exited:r4");
}

/// A database from before the one dedupe key (migrations 1 to 10), whose pruner could delete
/// the newest consumed events: its AUTOINCREMENT counter and the consumer's mark stand above
/// the largest `seq` left. After the upgrade, where a new event is numbered one above the
/// largest `seq`, the mark has come down so that the new event is read; the rows and the
/// dedupe by content are kept, and an id seen before no longer refuses another body.
#[tokio::test]
async fn a_database_whose_newest_events_were_pruned_still_reads_the_next_one() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("v10.db").display());
    let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
    {
        let mut conn = database_at(&url, 10).await;
        let json = |n: u32| serde_json::to_string(&exited(&issue, n, 1).event).expect("json");
        for n in 1..=4 {
            sqlx::query(
                "INSERT INTO deliveries (delivery_id, content_sha256, event_type, repo, number, \
                 event, received_at_ms, schema) VALUES (?, ?, 'run', 'acme/widgets', 1, ?, 1, 2)",
            )
            .bind(format!("exited:r{n}"))
            .bind(format!("hash-{n}"))
            .bind(json(n))
            .execute(&mut conn)
            .await
            .expect("row");
        }
        // All four consumed; the two newest pruned, as that build could.
        sqlx::raw_sql(
            "UPDATE consumer_mark SET seq = 4; DELETE FROM deliveries WHERE seq IN (3, 4);",
        )
        .execute(&mut conn)
        .await
        .expect("consumed and pruned");
    }
    let store = Store::connect(&director::settings::StoreSettings {
        url,
        ..Default::default()
    })
    .await
    .expect("migrates");
    assert_eq!(store.delivery_counts().await.expect("counts"), (0, 0));
    assert!(store.next_events(10).await.expect("read").is_empty());
    let mut again = exited(&issue, 9, 20);
    again.content_sha256 = "hash-2".into();
    let mut reused = exited(&issue, 5, 20);
    reused.delivery_id = "exited:r1".into();
    let fresh = store
        .insert_deliveries(&[again, reused])
        .await
        .expect("insert");
    assert_eq!(fresh, [false, true], "by content, not by id");
    let next = store.next_events(10).await.expect("read");
    assert_eq!(next.len(), 1, "the new event is read");
    assert_eq!(next[0].delivery_id, "exited:r1");
    assert!(
        next[0].seq > 2,
        "numbered after the rows kept: {}",
        next[0].seq
    );
}
