//! The store, against both backends: every test runs its body on SQLite and on a real
//! PostgreSQL (a fresh database each). What several replicas need is tested with several
//! `Store`s on one database, as several processes would hold.

use director::domain::{IssueRecord, IssueRef, Lifecycle, PullRecord, RunRecord, RunState};
use director::event::{Event, EventKind, ForgeEvent, IssueSnapshot};
use director::settings::StoreSettings;
use director::store::{
    Commit, Fence, Finished, Lane, NewAction, NewDelivery, ReadyDelivery, Store,
};

use crate::pg::Pg;

/// The databases one test runs on: (backend name, URL).
struct Backends {
    urls: Vec<(&'static str, String)>,
    _pg: Pg,
    _dir: tempfile::TempDir,
}

async fn backends() -> Backends {
    let dir = tempfile::tempdir().expect("dir");
    let pg = Pg::start();
    let urls = vec![
        (
            "sqlite",
            format!("sqlite://{}", dir.path().join("d.db").display()),
        ),
        ("postgres", pg.database().await),
    ];
    Backends {
        urls,
        _pg: pg,
        _dir: dir,
    }
}

async fn open(url: &str) -> Store {
    Store::connect(&StoreSettings {
        url: url.to_owned(),
        ..StoreSettings::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{url}: {e:#}"))
}

fn issue(n: u64) -> IssueRef {
    format!("acme/widgets#{n}").parse().expect("ref")
}

fn delivery(id: &str, body: &str, n: u64) -> NewDelivery {
    use sha2::Digest;
    NewDelivery {
        delivery_id: id.into(),
        content_sha256: hex::encode(sha2::Sha256::digest(body.as_bytes())),
        issue: issue(n),
        event: Event::Forge(ForgeEvent {
            kind: EventKind::Issues,
            action: "opened".into(),
            issue: issue(n),
            sender: "alice".into(),
            snapshot: IssueSnapshot {
                title: body.into(),
                ..IssueSnapshot::default()
            },
            is_pull: false,
            comment: None,
            review: None,
        }),
        received_at_ms: 1,
    }
}

fn ready(batch: Vec<NewDelivery>) -> Vec<ReadyDelivery> {
    batch
        .into_iter()
        .map(|d| d.ready().expect("ready"))
        .collect()
}

fn action(key: &str, n: u64, not_before_ms: i64) -> NewAction {
    NewAction {
        key: key.into(),
        issue: issue(n),
        kind: "sync_labels".into(),
        payload: r#"{"kind":"sync_labels"}"#.into(),
        max_attempts: 3,
        not_before_ms,
    }
}

/// The content hash is the one dedupe key: the same body under another id (Forgejo's
/// "Replay") is the same delivery; another body under an id seen before is another one.
#[tokio::test]
async fn a_delivery_is_stored_once_by_its_content_whatever_its_id() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        let fresh = store
            .insert_deliveries(&[
                delivery("d1", "one", 1),
                delivery("d1", "one again", 1),
                delivery("d2", "one", 1),
                delivery("d3", "three", 3),
                delivery("d4", "three", 3),
            ])
            .await
            .expect("insert");
        assert_eq!(fresh, vec![true, true, false, true, false], "{name}");
        let again = store
            .insert_deliveries(&[delivery("d3", "three", 3), delivery("d5", "one again", 1)])
            .await
            .expect("insert");
        assert_eq!(again, vec![false, false], "{name}");
        assert_eq!(
            store.pending_deliveries().await.expect("count"),
            3,
            "{name}"
        );
    }
}

#[tokio::test]
async fn intakes_own_sqlite_writer_stores_once_by_content_beside_other_writers() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&format!("sqlite://{}", dir.path().join("d.db").display())).await;
    let mut writer = store
        .delivery_writer()
        .expect("open the writer")
        .expect("SQLite has one");
    // The writer blocks: it runs on a thread of its own, as intake's does, while the
    // consumer's kind of commit writes records at the same time.
    let writes = std::thread::spawn(move || {
        let first = writer
            .insert(ready(vec![
                delivery("d1", "one", 1),
                delivery("d1", "one again", 1),
                delivery("d2", "one", 1),
                delivery("d3", "three", 3),
            ]))
            .expect("insert");
        let mut rest = Vec::new();
        for n in 0..50 {
            rest.extend(
                writer
                    .insert(ready(vec![delivery(&format!("w{n}"), &format!("w{n}"), 4)]))
                    .expect("insert"),
            );
        }
        let again = writer
            .insert(ready(vec![delivery("d3", "three", 3)]))
            .expect("insert");
        (first, rest, again)
    });
    for n in 0..50 {
        let commit = Commit {
            records: vec![IssueRecord::new(&issue(100 + n), 5)],
            ..Commit::default()
        };
        store
            .commit(&commit, 10)
            .await
            .expect("commit beside the writer");
    }
    let (first, rest, again) = writes.join().expect("writer thread");
    assert_eq!(first, vec![true, true, false, true]);
    assert!(rest.iter().all(|new| *new), "{rest:?}");
    assert_eq!(again, vec![false]);
    let events = store.next_events(100).await.expect("events");
    assert_eq!(events.len(), 53);
    let ids: Vec<&str> = events[..3].iter().map(|e| e.delivery_id.as_str()).collect();
    assert_eq!(
        ids,
        ["d1", "d1", "d3"],
        "another body under a known id is stored"
    );
    assert_eq!(
        events[0].event.as_ref().expect("parses"),
        &delivery("d1", "one", 1).event,
        "the event reads back as it was stored"
    );
    for n in 0..50 {
        assert!(store.issue(&issue(100 + n)).await.expect("read").is_some());
    }
}

/// Intake's writer hands what it stored to the consumer in memory; events other writers stored
/// in between, and those past what it holds, are read from the database: either way each
/// comes back once, in arrival order, as it was stored.
#[tokio::test]
async fn events_intake_hands_over_and_events_read_back_come_in_order_and_alike() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let store = open(&url).await;
    let mut writer = store
        .delivery_writer()
        .expect("open the writer")
        .expect("SQLite has one");
    let mut sent = Vec::new();
    let mut batch = |from: usize, to: usize| -> Vec<NewDelivery> {
        let made: Vec<NewDelivery> = (from..to)
            .map(|n| delivery(&format!("held-{n}"), &format!("held {n}"), 1 + n as u64 % 7))
            .collect();
        sent.extend(
            made.iter()
                .map(|d| (d.delivery_id.clone(), d.event.clone())),
        );
        made
    };
    let first = batch(0, 10);
    let over = batch(10, 1_100);
    let last = batch(1_100, 1_105);
    // The writer blocks: it runs on a thread of its own, as intake's does.
    let writer = tokio::task::spawn_blocking(move || {
        writer.insert(ready(first)).expect("insert");
        writer
    })
    .await
    .expect("writer");
    // Another writer's event between intake's.
    let outcome = delivery("outcome-1", "an outcome", 2);
    store
        .insert_deliveries(std::slice::from_ref(&outcome))
        .await
        .expect("insert");
    // More than the consumer is handed in memory: the rest is read back.
    tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        writer.insert(ready(over)).expect("insert");
        writer.insert(ready(last)).expect("insert");
    })
    .await
    .expect("writer");
    let mut expected = sent[..10].to_vec();
    expected.push((outcome.delivery_id.clone(), outcome.event.clone()));
    expected.extend(sent[10..].iter().cloned());
    // Spoil two rows' JSON behind the store's back: one of an event the consumer is handed in
    // memory (it comes through intact: its JSON is not read again) and one past what it holds
    // (read back, it no longer parses).
    {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open");
        sqlx::query(
            "UPDATE deliveries SET event = 'spoilt' WHERE delivery_id IN ('held-0', 'held-1104')",
        )
        .execute(&mut conn)
        .await
        .expect("spoil");
    }
    expected.pop();

    let mut seen = Vec::new();
    loop {
        let events = store.next_events(256).await.expect("events");
        if events.is_empty() {
            break;
        }
        assert!(
            events.windows(2).all(|w| w[0].seq < w[1].seq),
            "arrival order"
        );
        let commit = Commit {
            consumed: events.iter().map(|e| e.seq).collect(),
            ..Commit::default()
        };
        for e in events {
            if e.delivery_id == "held-1104" {
                assert!(e.event.is_err(), "read back from the spoilt row");
                continue;
            }
            seen.push((e.delivery_id, e.event.expect("parses")));
        }
        store.commit(&commit, 10).await.expect("consume");
    }
    assert_eq!(seen.len(), expected.len());
    assert!(seen == expected, "every event once, in order, as stored");
    assert_eq!(store.pending_deliveries().await.expect("count"), 0);
}

/// A batch is consumed once: a second consumer that read the same events (two processes on
/// one SQLite file), or a commit that skips an event, fails and changes nothing.
#[tokio::test]
async fn events_are_consumed_once_and_in_order_or_the_commit_fails_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let (one, two) = (open(&url).await, open(&url).await);
    one.insert_deliveries(&[
        delivery("a", "a", 1),
        delivery("b", "b", 2),
        delivery("c", "c", 3),
    ])
    .await
    .expect("insert");
    let read_by_one = one.next_events(10).await.expect("events");
    let read_by_two = two.next_events(10).await.expect("events");
    assert_eq!(read_by_one.len(), 3);
    let seqs: Vec<i64> = read_by_one.iter().map(|e| e.seq).collect();

    // Skipping the first event is refused, and so is everything the commit carried.
    let gap = Commit {
        records: vec![IssueRecord::new(&issue(9), 5)],
        consumed: seqs[1..].to_vec(),
        ..Commit::default()
    };
    let err = one.commit(&gap, 10).await.expect_err("a gap");
    assert!(format!("{err:#}").contains("in order"), "{err:#}");
    assert!(one.issue(&issue(9)).await.expect("read").is_none());
    assert_eq!(one.pending_deliveries().await.expect("count"), 3);

    let whole = Commit {
        consumed: seqs[..2].to_vec(),
        dead: vec![(seqs[2], "does not parse".into())],
        ..Commit::default()
    };
    one.commit(&whole, 10).await.expect("consume");
    let late = Commit {
        records: vec![IssueRecord::new(&issue(8), 5)],
        consumed: read_by_two.iter().map(|e| e.seq).collect(),
        ..Commit::default()
    };
    two.commit(&late, 11)
        .await
        .expect_err("already consumed by the other");
    assert!(two.issue(&issue(8)).await.expect("read").is_none());
    assert!(one.next_events(10).await.expect("events").is_empty());
    assert_eq!(
        one.dead_events().await.expect("dead"),
        vec![("c".to_owned(), "does not parse".to_owned())]
    );
}

/// Prunes in rounds of `batch` rows until a round deletes nothing; how many went.
async fn prune_until_done(store: &Store, before_ms: i64, batch: u32) -> u64 {
    let mut deleted = 0;
    loop {
        let n = store.prune(before_ms, batch).await.expect("prune");
        if n == 0 {
            return deleted;
        }
        deleted += n;
    }
}

/// Retention on SQLite finds the old deliveries by bisecting their numbers, not by reading
/// them: those received before the cutoff and consumed go, in small batches; those received
/// since, those not yet consumed and those set aside stay.
#[tokio::test]
async fn retention_deletes_consumed_deliveries_received_before_the_cutoff_and_no_other() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&format!("sqlite://{}", dir.path().join("d.db").display())).await;
    let batch: Vec<NewDelivery> = (1..=9u64)
        .map(|n| {
            let mut d = delivery(&format!("r{n}"), &format!("r{n}"), n);
            d.received_at_ms = i64::try_from(n).expect("small") * 10;
            d
        })
        .collect();
    store.insert_deliveries(&batch).await.expect("insert");
    let events = store.next_events(7).await.expect("events");
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    store
        .commit(
            &Commit {
                consumed: seqs[1..].to_vec(),
                dead: vec![(seqs[0], "does not parse".into())],
                ..Commit::default()
            },
            1_000,
        )
        .await
        .expect("consume");
    // Received at 10 to 90; 10 set aside, 80 and 90 not consumed.
    let deleted = prune_until_done(&store, 55, 2).await;
    assert_eq!(deleted, 4, "received at 20, 30, 40 and 50");
    let (total, pending) = store.delivery_counts().await.expect("counts");
    assert_eq!((total, pending), (5, 2));
    assert_eq!(store.dead_events().await.expect("dead").len(), 1);
    // Nothing received yet before the cutoff: nothing goes.
    assert_eq!(store.prune(0, 100).await.expect("prune"), 0);
}

/// SQLite numbers a new event one above the largest `seq` in the table. Were the newest event
/// pruned with the rest once everything is consumed and old, the next one would be numbered
/// at or below the consumer's mark, taken for consumed, and never decided.
#[tokio::test]
async fn retention_keeps_the_newest_event_so_the_next_one_is_not_taken_for_consumed() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&format!("sqlite://{}", dir.path().join("d.db").display())).await;
    let batch: Vec<NewDelivery> = (1..=3u64)
        .map(|n| delivery(&format!("old{n}"), &format!("old {n}"), n))
        .collect();
    store.insert_deliveries(&batch).await.expect("insert");
    let events = store.next_events(10).await.expect("events");
    let last = events.last().expect("three events").seq;
    store
        .commit(
            &Commit {
                consumed: events.iter().map(|e| e.seq).collect(),
                ..Commit::default()
            },
            1_000,
        )
        .await
        .expect("consume");
    let deleted = prune_until_done(&store, i64::MAX, 100).await;
    assert_eq!(deleted, 2, "all consumed and old, but the newest stays");
    assert_eq!(store.delivery_counts().await.expect("counts"), (1, 0));
    store
        .insert_deliveries(&[delivery("new", "new", 4)])
        .await
        .expect("insert");
    let next = store.next_events(10).await.expect("events");
    assert_eq!(next.len(), 1, "the new event is waiting");
    assert_eq!(next[0].delivery_id, "new");
    assert!(next[0].seq > last, "{} after {last}", next[0].seq);
}

#[tokio::test]
async fn a_commit_writes_every_changed_record_and_of_two_for_one_issue_the_later() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        // More records than one statement takes.
        let mut records: Vec<IssueRecord> =
            (1..=600).map(|n| IssueRecord::new(&issue(n), 5)).collect();
        let mut later = IssueRecord::new(&issue(7), 6);
        later.title = "the later one".into();
        records.push(later.clone());
        let commit = Commit {
            records,
            ..Commit::default()
        };
        store.commit(&commit, 10).await.expect("commit");
        assert_eq!(
            store.issue(&issue(7)).await.expect("read"),
            Some(later),
            "{name}"
        );
        assert_eq!(
            store.issue(&issue(600)).await.expect("read"),
            Some(IssueRecord::new(&issue(600), 5)),
            "{name}"
        );
        assert!(
            store.issue(&issue(601)).await.expect("read").is_none(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_commit_consumes_its_events_with_the_records_runs_and_actions_they_caused() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        store
            .insert_deliveries(&[delivery("a", "a", 1), delivery("b", "b", 2)])
            .await
            .expect("insert");
        let events = store.next_events(10).await.expect("events");
        assert_eq!(events.len(), 2, "{name}");
        assert!(events[0].seq < events[1].seq, "{name}: arrival order");
        let mut record = IssueRecord::new(&issue(1), 5);
        record.lifecycle = Lifecycle::Succeeded;
        record.trigger_present = true;
        record.trigger_trusted = Some(true);
        record.pr = Some(PullRecord::opened(9, "director-issue-1-x"));
        let mut run = RunRecord::admitted(
            &issue(1),
            crate::helpers::rid("r1"),
            "director-issue-1-x",
            5,
        );
        run.stop_requested = true;
        let commit = Commit {
            records: vec![record.clone()],
            runs: vec![run.clone()],
            actions: vec![action("k1", 1, 0), action("k1", 1, 0)],
            consumed: vec![events[0].seq],
            ..Commit::default()
        };
        store.commit(&commit, 10).await.expect("commit");
        assert_eq!(
            store.issue(&issue(1)).await.expect("read"),
            Some(record.clone()),
            "{name}"
        );
        assert_eq!(
            store.run(&crate::helpers::rid("r1")).await.expect("read"),
            Some(run),
            "{name}"
        );
        assert_eq!(
            store.actions_of(&issue(1)).await.expect("read").len(),
            1,
            "{name}"
        );
        let left = store.next_events(10).await.expect("events");
        assert_eq!(left.len(), 1, "{name}");
        assert_eq!(left[0].delivery_id, "b", "{name}");
        assert_eq!(
            store
                .issues_of_pulls(&[issue(9), issue(8)])
                .await
                .expect("pulls"),
            vec![(issue(9), issue(1))],
            "{name}"
        );
        assert_eq!(
            store
                .open_pull_counts()
                .await
                .expect("counts")
                .get(&"acme/widgets".parse().expect("repo")),
            Some(&1),
            "{name}"
        );
        assert_eq!(store.issues_with_open_pulls().await.expect("read").len(), 1);
    }
}

/// A consumer pass reads the next events with what they are decided on (a pull request's
/// event goes to the issue whose run opened it), commits what its plan made of them, and says
/// what came of it. Run through the consumer's own connection on SQLite and the pool on
/// PostgreSQL: both read and write alike.
#[tokio::test]
async fn a_pass_hands_its_plan_the_events_with_their_issues_records_and_runs_and_commits_it() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        let sqlite = *name == "sqlite";
        let idle = store
            .pass(10, |input| {
                assert!(input.events.is_empty());
                (Commit::default(), 1)
            })
            .await
            .expect("idle pass");
        assert_eq!(idle.events, 0, "{name}");
        // SQLite looks for queued issues itself; PostgreSQL leaves it to admission.
        assert_eq!(idle.queued, !sqlite, "{name}");

        let mut record = IssueRecord::new(&issue(1), 5);
        record.lifecycle = Lifecycle::Succeeded;
        record.pr = Some(PullRecord::opened(9, "director-issue-1-x"));
        let run = RunRecord::admitted(
            &issue(1),
            crate::helpers::rid("r1"),
            "director-issue-1-x",
            5,
        );
        store
            .commit(
                &Commit {
                    records: vec![record.clone()],
                    runs: vec![run.clone()],
                    ..Commit::default()
                },
                5,
            )
            .await
            .expect("seed");
        let mut review = delivery("on-the-pull", "review", 9);
        if let Event::Forge(f) = &mut review.event {
            f.is_pull = true;
        }
        store
            .insert_deliveries(&[delivery("a", "a", 2), review, delivery("c", "c", 3)])
            .await
            .expect("insert");

        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let passed = store
            .pass(10, move |input| {
                let targets: Vec<(String, Option<IssueRef>)> = input
                    .events
                    .iter()
                    .map(|(e, target)| (e.delivery_id.clone(), target.clone()))
                    .collect();
                let mut queued = IssueRecord::new(&issue(3), 20);
                queued.lifecycle = Lifecycle::Queued;
                let commit = Commit {
                    records: vec![queued],
                    actions: vec![action("k-pass", 3, 0)],
                    consumed: input.events.iter().map(|(e, _)| e.seq).collect(),
                    ..Commit::default()
                };
                let _ = seen_tx.send((targets, input.records, input.runs));
                (commit, 20)
            })
            .await
            .expect("pass");
        let (targets, records, runs) = seen_rx.recv().expect("the plan ran");
        assert_eq!(
            targets,
            vec![
                ("a".to_owned(), Some(issue(2))),
                ("on-the-pull".to_owned(), Some(issue(1))),
                ("c".to_owned(), Some(issue(3))),
            ],
            "{name}: in arrival order, the review on the issue that opened the pull request"
        );
        assert_eq!(records.len(), 1, "{name}: only issue 1 has a record");
        assert_eq!(records.get(&issue(1)), Some(&record), "{name}");
        assert_eq!(runs.get(&issue(1)), Some(&run), "{name}");
        assert_eq!(runs.len(), 1, "{name}");
        assert_eq!(passed.events, 3, "{name}");
        assert!(
            passed.actions && !passed.runs && passed.queued,
            "{name}: {passed:?}"
        );
        assert_eq!(
            store
                .issue(&issue(3))
                .await
                .expect("read")
                .map(|r| r.lifecycle),
            Some(Lifecycle::Queued),
            "{name}"
        );
        assert_eq!(store.actions_of(&issue(3)).await.expect("read").len(), 1);
        assert!(
            store.next_events(10).await.expect("read").is_empty(),
            "{name}"
        );
        let after = store
            .pass(10, |_| (Commit::default(), 21))
            .await
            .expect("idle pass");
        assert_eq!((after.events, after.queued), (0, true), "{name}");
    }
}

/// Two processes on one SQLite file, each passing the same events: the one that commits second
/// finds the mark moved under it, and nothing it planned is written; the events stay
/// consumed once.
#[tokio::test]
async fn a_pass_that_loses_the_race_for_its_events_commits_nothing_it_planned() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    let (one, two) = (open(&url).await, open(&url).await);
    one.insert_deliveries(&[delivery("a", "a", 1), delivery("b", "b", 2)])
        .await
        .expect("insert");
    let (read_tx, read_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let late = tokio::spawn(async move {
        two.pass(10, move |input| {
            let _ = read_tx.send(input.events.len());
            // Holds the pass between its reads and its commit until the other has committed.
            let _ = go_rx.recv();
            let commit = Commit {
                records: vec![IssueRecord::new(&issue(7), 5)],
                actions: vec![action("k-late", 7, 0)],
                consumed: input.events.iter().map(|(e, _)| e.seq).collect(),
                ..Commit::default()
            };
            (commit, 5)
        })
        .await
        .map(|_| two)
    });
    assert_eq!(read_rx.await.expect("the late pass read"), 2);
    let first = one
        .pass(10, |input| {
            let consumed = input.events.iter().map(|(e, _)| e.seq).collect();
            (
                Commit {
                    consumed,
                    ..Commit::default()
                },
                5,
            )
        })
        .await
        .expect("the first pass");
    assert_eq!(first.events, 2);
    go_tx.send(()).expect("release the late pass");
    let err = late.await.expect("task").expect_err("the mark moved");
    assert!(format!("{err:#}").contains("in order"), "{err:#}");
    assert!(one.issue(&issue(7)).await.expect("read").is_none());
    assert!(one.actions_of(&issue(7)).await.expect("read").is_empty());
    assert_eq!(one.pending_deliveries().await.expect("count"), 0);
}

#[tokio::test]
async fn an_issue_never_has_two_active_runs_and_a_refused_commit_changes_nothing() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        let first = RunRecord::admitted(&issue(1), crate::helpers::rid("r1"), "b1", 1);
        store
            .commit(
                &Commit {
                    runs: vec![first],
                    ..Commit::default()
                },
                1,
            )
            .await
            .expect("first run");
        let second = RunRecord::admitted(&issue(1), crate::helpers::rid("r2"), "b2", 2);
        let err = store
            .commit(
                &Commit {
                    runs: vec![second],
                    actions: vec![action("start:r2", 1, 0)],
                    ..Commit::default()
                },
                2,
            )
            .await;
        assert!(err.is_err(), "{name}: a second active run was accepted");
        assert_eq!(
            store.runs_of(&issue(1)).await.expect("runs").len(),
            1,
            "{name}"
        );
        assert!(
            store
                .actions_of(&issue(1))
                .await
                .expect("actions")
                .is_empty(),
            "{name}"
        );
        let mut ended = RunRecord::admitted(&issue(1), crate::helpers::rid("r1"), "b1", 1);
        ended.state = RunState::Failed;
        let next = RunRecord::admitted(&issue(1), crate::helpers::rid("r3"), "b3", 3);
        store
            .commit(
                &Commit {
                    runs: vec![ended, next],
                    ..Commit::default()
                },
                3,
            )
            .await
            .expect("once the first ended");
        assert_eq!(
            store.latest_runs(&[issue(1)]).await.expect("latest")[0].id,
            crate::helpers::rid("r3")
        );
    }
}

#[tokio::test]
async fn actions_are_claimed_oldest_first_one_per_issue_under_leases_that_run_out() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        store
            .commit(
                &Commit {
                    actions: vec![action("a1", 1, 0), action("a2", 1, 0), action("b1", 2, 0)],
                    ..Commit::default()
                },
                0,
            )
            .await
            .expect("commit");
        let claimed = store
            .claim_actions("x", Lane::Except("read_preflight"), 10, 1_000, 100)
            .await
            .expect("claim");
        let keys: Vec<&str> = claimed.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(keys, ["a1", "b1"], "{name}: one per issue, oldest first");
        let none = store
            .claim_actions("y", Lane::Except("read_preflight"), 10, 1_000, 200)
            .await
            .expect("claim");
        assert!(none.is_empty(), "{name}: leased");
        // The holder died: its leases run out and another takes the work over.
        let taken = store
            .claim_actions("y", Lane::Except("read_preflight"), 10, 1_000, 1_200)
            .await
            .expect("claim");
        assert_eq!(taken.len(), 2, "{name}");
        let a1 = taken.iter().find(|c| c.key == "a1").expect("a1").id;
        store
            .record_outcomes(
                &[Finished::Done {
                    id: a1,
                    event: None,
                }],
                1_300,
            )
            .await
            .expect("done");
        let next = store
            .claim_actions("y", Lane::Except("read_preflight"), 10, 1_000, 3_000)
            .await
            .expect("claim");
        assert!(
            next.iter().any(|c| c.key == "a2"),
            "{name}: the next of issue 1"
        );
    }
}

#[tokio::test]
async fn replicas_claiming_at_once_never_take_the_same_action() {
    let b = backends().await;
    for (name, url) in &b.urls {
        // Replicas are separate processes on PostgreSQL; SQLite serves one process, whose
        // executors share its store.
        let stores = if *name == "postgres" {
            [open(url).await, open(url).await, open(url).await]
        } else {
            let one = open(url).await;
            [one.clone(), one.clone(), one]
        };
        let actions: Vec<NewAction> = (1..=60).map(|i| action(&format!("k{i}"), i, 0)).collect();
        stores[0]
            .commit(
                &Commit {
                    actions,
                    ..Commit::default()
                },
                0,
            )
            .await
            .expect("commit");
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = store
                        .claim_actions(
                            &format!("r{i}"),
                            Lane::Except("read_preflight"),
                            4,
                            60_000,
                            10,
                        )
                        .await
                        .expect("claim");
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.key));
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!(
            (total, all.len()),
            (60, 60),
            "{name}: each action claimed exactly once"
        );
    }
}

#[tokio::test]
async fn a_lease_is_held_by_one_replica_until_it_runs_out_and_fences_its_commits() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let a = open(url).await;
        let b2 = open(url).await;
        assert!(
            a.hold_lease("consumer", "a", 1_000, 0).await.expect("hold"),
            "{name}"
        );
        assert!(
            !b2.hold_lease("consumer", "b", 1_500, 500)
                .await
                .expect("hold"),
            "{name}"
        );
        assert!(
            a.hold_lease("consumer", "a", 2_000, 900)
                .await
                .expect("renew"),
            "{name}"
        );
        assert_eq!(
            a.lease_holder("consumer", 1_000).await.expect("who"),
            Some("a".into())
        );
        // `a` stops renewing: after its lease runs out `b` takes over, and a late commit by
        // `a` is refused whole.
        assert!(
            b2.hold_lease("consumer", "b", 5_000, 2_001)
                .await
                .expect("take"),
            "{name}"
        );
        let late = Commit {
            actions: vec![action("late", 1, 0)],
            fence: Some(Fence {
                name: "consumer".into(),
                owner: "a".into(),
                until_ms: 9_000,
            }),
            ..Commit::default()
        };
        assert!(a.commit(&late, 2_100).await.is_err(), "{name}: fenced");
        assert!(
            a.actions_of(&issue(1)).await.expect("read").is_empty(),
            "{name}"
        );
        let fenced_ok = Commit {
            fence: Some(Fence {
                name: "consumer".into(),
                owner: "b".into(),
                until_ms: 6_000,
            }),
            ..late
        };
        b2.commit(&fenced_ok, 2_200)
            .await
            .expect("the holder commits");
        a.release_lease("consumer", "b").await.expect("release");
        assert_eq!(a.lease_holder("consumer", 2_300).await.expect("who"), None);
        assert!(
            a.claim_once("scan:full:7", "a", 10).await.expect("claim"),
            "{name}"
        );
        assert!(
            !b2.claim_once("scan:full:7", "b", 11).await.expect("claim"),
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_director_id_is_made_once_and_shared_by_every_replica() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let first = open(url).await.director_id().await.expect("id");
        let second = open(url).await.director_id().await.expect("id");
        assert_eq!(first, second, "{name}");
        assert_eq!(first.len(), 8, "{name}");
    }
}

#[tokio::test]
async fn the_egress_key_is_made_once_and_refusals_add_up_per_run_and_destination() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let first = open(url).await.egress_key().await.expect("key");
        let second = open(url).await.egress_key().await.expect("key");
        assert_eq!(
            first, second,
            "{name}: every replica checks the same passwords"
        );
        assert_eq!(first.len(), 32, "{name}");
        let store = open(url).await;
        let batch = |n| {
            std::collections::BTreeMap::from([
                (
                    (crate::helpers::rid("run1"), "example.org:443".to_owned()),
                    n,
                ),
                (
                    (crate::helpers::rid("run2"), "example.org:443".to_owned()),
                    1,
                ),
            ])
        };
        store.add_egress_refusals(&batch(2)).await.expect("added");
        store.add_egress_refusals(&batch(3)).await.expect("added");
        assert_eq!(
            store
                .egress_refusals(&crate::helpers::rid("run1"))
                .await
                .expect("read"),
            vec![("example.org:443".to_owned(), 5)],
            "{name}"
        );
        assert_eq!(
            store
                .egress_refusals(&crate::helpers::rid("run2"))
                .await
                .expect("read"),
            vec![("example.org:443".to_owned(), 2)],
            "{name}"
        );
    }
}

#[tokio::test]
async fn pre_flight_calls_are_counted_per_window_and_old_rows_pruned() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let store = open(url).await;
        let repo = "acme/widgets".parse().expect("repo");
        let other = "acme/other".parse().expect("repo");
        for at in [10, 20, 30] {
            store
                .record_preflight_call(&repo, at)
                .await
                .expect("record");
        }
        store
            .record_preflight_call(&other, 25)
            .await
            .expect("record");
        let w = store
            .preflight_calls_since(&repo, 15)
            .await
            .expect("window");
        assert_eq!(
            (w.total, w.oldest_ms, w.repo_total, w.repo_oldest_ms),
            (3, Some(20), 2, Some(20)),
            "{name}"
        );
        store.cache_reading("h", "GO", "m", 1).await.expect("cache");
        store
            .cache_reading("h", "other", "m", 2)
            .await
            .expect("cache");
        assert_eq!(
            store.cached_reading("h").await.expect("read"),
            Some(("GO".into(), "m".into()))
        );
        assert_eq!(store.prune(22, 100).await.expect("prune"), 2, "{name}");
    }
}

#[tokio::test]
async fn replicas_starting_at_once_migrate_one_database_once() {
    let pg = Pg::start();
    let url = pg.database().await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move { open(&url).await }));
    }
    for t in tasks {
        t.await.expect("task").ping().await.expect("usable");
    }
}

#[tokio::test]
async fn a_bad_or_unreachable_store_url_names_the_key_and_never_the_password() {
    for url in [
        "postgres://director:s3cret-pw@127.0.0.1:1/director",
        "mysql://director:s3cret-pw@localhost/db",
        "postgres://director:s3cret-pw@[::1/x",
    ] {
        let err = Store::connect(&StoreSettings {
            url: url.to_owned(),
            ..StoreSettings::default()
        })
        .await
        .expect_err(url);
        let text = format!("{err:#}");
        assert!(text.contains("store.url"), "{url}: {text}");
        assert!(!text.contains("s3cret-pw"), "{url}: {text}");
    }
}

/// The checkpoint sequence number in a write-ahead log's header: one more each time the log
/// is started over.
fn log_generation(wal: &std::path::Path) -> Option<u32> {
    use std::io::Read as _;
    let mut header = [0; 16];
    std::fs::File::open(wal)
        .ok()?
        .read_exact(&mut header)
        .ok()?;
    Some(u32::from_be_bytes(header[12..16].try_into().ok()?))
}

/// Under commits with no pause between them, SQLite's write-ahead log is still started over
/// and written again from its start, instead of growing for as long as the load lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_commits_with_no_pause_the_write_ahead_log_is_started_over() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("d.db");
    let store = open(&format!("sqlite://{}", db.display())).await;
    let wal = dir.path().join("d.db-wal");
    let mut writer = store
        .delivery_writer()
        .expect("open the writer")
        .expect("SQLite has one");
    // Readers all the while, as the consumer and the executors are: a reader in the log
    // when a writer would start it over is what keeps SQLite from doing so by itself.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = tokio::spawn({
        let (store, writing) = (store.clone(), writing.clone());
        async move {
            let mut reads = 0u64;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                store.next_events(64).await.expect("read");
                store.pending_deliveries().await.expect("count");
                reads += 1;
            }
            reads
        }
    });
    // Two restarts take about 130 MB of log, a few seconds here; the deadline leaves a slower
    // machine ten times as long.
    let written = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let body = "x".repeat(1_200);
        let mut first = None;
        let mut restarts = 0;
        let mut largest = 0;
        let mut n = 0u64;
        while restarts < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "{n} deliveries stored without a pause and the log was started over \
                 {restarts} times; its file is {largest} bytes"
            );
            let batch = (0..4)
                .map(|i| delivery(&format!("d{n}-{i}"), &format!("{body} {n} {i}"), 1 + n % 50))
                .collect();
            let fresh = writer.insert(ready(batch)).expect("insert");
            assert!(fresh.iter().all(|new| *new));
            n += 1;
            if n.is_multiple_of(16) {
                largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
                let now = log_generation(&wal);
                first = first.or(now);
                restarts = now.zip(first).map_or(0, |(now, first)| now - first);
            }
        }
        (n * 4, largest)
    })
    .await;
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await.expect("reader");
    let (stored, largest) = written.expect("writer thread");
    assert!(reads > 0);
    assert!(
        largest < 128 << 20,
        "the log's file reached {largest} bytes over {stored} deliveries"
    );
    assert_eq!(
        store.pending_deliveries().await.expect("count"),
        i64::try_from(stored).expect("count"),
        "every delivery is there after the log was started over"
    );
}

#[tokio::test]
async fn forecast_samples_read_finished_runs_with_their_metered_cost_on_both_backends() {
    let b = backends().await;
    for (backend, url) in &b.urls {
        let store = open(url).await;
        let issue: IssueRef = "acme/widgets#1".parse().expect("ref");
        let mut done = RunRecord::admitted(&issue, crate::helpers::rid("f0000000000a"), "b1", 1);
        done.state = RunState::Succeeded;
        done.started_at_ms = Some(1_000);
        done.finished_at_ms = Some(121_000);
        let mut follow = done.clone();
        follow.id = crate::helpers::rid("f0000000000b");
        follow.followup = Some(director::domain::FollowUp {
            pr: 3,
            feedback: director::domain::Feedback {
                key: "review:1".into(),
                by: "alice".into(),
                text: "Rename it.".into(),
            },
            start_head: None,
        });
        // Running, and refused before a container: not samples.
        let mut running = RunRecord::admitted(&issue, crate::helpers::rid("f0000000000c"), "b3", 1);
        running.state = RunState::Running;
        running.started_at_ms = Some(1_000);
        let mut refused = RunRecord::admitted(&issue, crate::helpers::rid("f0000000000d"), "b4", 1);
        refused.state = RunState::Refused;
        store
            .commit(
                &Commit {
                    runs: vec![done, follow, running, refused],
                    ..Default::default()
                },
                2,
            )
            .await
            .expect("runs");
        let chosen = director::domain::AgentChoice {
            name: "aider".into(),
            source: director::domain::AgentSource::Operator,
        };
        // Written while launching, as the start writes it; the run ended later.
        store
            .put_run_agent(&crate::helpers::rid("f0000000000c"), &chosen)
            .await
            .expect("agent");
        for (cost, run) in [
            (Some(0.25), "f0000000000a"),
            (Some(0.5), "f0000000000a"),
            (None, "f0000000000b"),
        ] {
            store
                .record_model_usage(&director::models::Metered {
                    run_id: Some(crate::helpers::rid(run)),
                    repo: "acme/widgets".parse().expect("repo"),
                    issue: None,
                    provider: director::models::Provider::Openai,
                    model: "gpt-5".into(),
                    usage: Default::default(),
                    cost_usd: cost,
                    at_ms: 5,
                })
                .await
                .expect("usage");
        }
        let mut samples = store.forecast_samples().await.expect("samples");
        samples.sort_by_key(|s| s.followup);
        assert_eq!(samples.len(), 2, "{backend}: {samples:?}");
        assert_eq!(samples[0].cost_usd, Some(0.75), "{backend}");
        assert_eq!(
            (samples[0].secs, samples[0].followup),
            (120, false),
            "{backend}"
        );
        assert_eq!(samples[1].cost_usd, None, "{backend}: an unpriced call");
        assert!(samples[1].followup, "{backend}");
    }
}

#[tokio::test]
async fn a_runs_base_commit_is_kept_as_a_commit_and_a_stored_non_commit_is_refused() {
    use director::domain::CommitSha;
    let b = backends().await;
    let sha = CommitSha::parse(&"Ab".repeat(20)).expect("a commit");
    for (backend, url) in &b.urls {
        let store = open(url).await;
        let run = RunRecord::admitted(
            &issue(1),
            crate::helpers::rid("r1"),
            "director-issue-1-x",
            5,
        );
        let commit = Commit {
            runs: vec![run],
            ..Commit::default()
        };
        store.commit(&commit, 10).await.expect("commit");
        store
            .put_run_base(&crate::helpers::rid("r1"), &sha)
            .await
            .expect("base");
        let read = store.run(&crate::helpers::rid("r1")).await.expect("read");
        let base = read.and_then(|r| r.base_commit);
        assert_eq!(
            base.as_ref().map(CommitSha::as_str),
            Some(&*"ab".repeat(20)),
            "{backend}"
        );
    }
    // A base commit changed under the director (by hand, or a bug) to something git would
    // take as an option or a branch is not handed on as a commit: reading the run fails,
    // naming the column.
    let (_, url) = &b.urls[0];
    let path = url.strip_prefix("sqlite://").expect("a file");
    let db = rusqlite::Connection::open(path).expect("open");
    db.execute(
        "UPDATE runs SET base_commit = '--upload-pack=touch /tmp/x' WHERE id = ?1",
        [crate::helpers::rid("r1").as_str()],
    )
    .expect("update");
    let store = open(url).await;
    let err = store
        .run(&crate::helpers::rid("r1"))
        .await
        .expect_err("not a commit");
    assert!(format!("{err:#}").contains("stored base commit"), "{err:#}");
}
