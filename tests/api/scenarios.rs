//! The issue stories of the Forgejo client, tracking, trust and scan, told against the real
//! app and a FakeForge served over HTTP.

use director::domain::Lifecycle;
use director::forge::Permission;

use crate::forge_helpers::{BOT, ForgeApp, READER, TRIGGER, WRITER};
use crate::helpers::wait_until;

const MARKER: &str = "<!-- director:untrusted-trigger -->";

#[tokio::test]
async fn an_issue_labelled_by_a_writer_is_picked_up() {
    let t = ForgeApp::spawn().await;
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Add --verbose", "Print what it does.")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    let record = t.app.wait_state(&issue, Lifecycle::Pending).await;
    assert_eq!(record.trigger_actor.as_deref(), Some(WRITER));
    assert_eq!(record.trigger_trusted, Some(true));
    assert!(
        t.forge.comments_on(&issue).is_empty(),
        "a trusted trigger needs no explanation"
    );
    t.assert_contract();
}

#[tokio::test]
async fn an_issue_labelled_by_a_reader_is_not_picked_up_and_says_why_once() {
    let t = ForgeApp::spawn().await;
    // The repository lets the reader label (as a misconfigured team might); trust is checked
    // on the actor, never on `repository.permissions` in the payload.
    let issue = t
        .forge
        .open_issue(&t.repo, READER, "Please do my homework", "")
        .await;
    t.forge.label(READER, &issue, TRIGGER).await;
    t.app.wait_processed().await;
    wait_until("the explanation is posted", || async {
        !t.forge.comments_on(&issue).is_empty()
    })
    .await;
    let record = t.record(&issue).await.expect("recorded");
    assert_eq!(record.lifecycle, Lifecycle::Untracked);
    assert_eq!(record.trigger_actor.as_deref(), Some(READER));
    assert_eq!(record.trigger_trusted, Some(false));

    // Again: removed and applied by the same reader, and a scan on top.
    t.forge.unlabel(READER, &issue, TRIGGER).await;
    t.forge.label(READER, &issue, TRIGGER).await;
    t.scan().await;
    t.app.wait_processed().await;
    let comments = t.forge.comments_on(&issue);
    assert_eq!(
        comments.len(),
        1,
        "exactly one explanatory comment: {comments:#?}"
    );
    assert_eq!(comments[0].author, BOT);
    assert!(comments[0].body.contains(MARKER));
    assert!(comments[0].body.contains(&format!("@{READER}")));
    assert_eq!(
        t.record(&issue).await.expect("recorded").lifecycle,
        Lifecycle::Untracked
    );
    t.assert_contract();
}

#[tokio::test]
async fn an_issue_labelled_while_no_webhook_arrived_is_picked_up_by_the_next_scan() {
    let t = ForgeApp::spawn().await;
    t.forge.webhooks_enabled(false);
    let issue = t.forge.open_issue(&t.repo, "reporter", "Missed", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_processed().await;
    assert!(t.record(&issue).await.is_none(), "no webhook arrived");
    let report = t.scan().await;
    assert_eq!(report.labelled, 1);
    assert_eq!(report.queued, 1);
    let record = t.app.wait_state(&issue, Lifecycle::Pending).await;
    assert_eq!(
        record.trigger_actor.as_deref(),
        Some(WRITER),
        "the timeline names who labelled it"
    );
    t.assert_contract();
}

#[tokio::test]
async fn removing_the_label_or_closing_the_issue_cancels() {
    let t = ForgeApp::spawn().await;
    let a = t.forge.open_issue(&t.repo, "reporter", "A", "").await;
    let b = t.forge.open_issue(&t.repo, "reporter", "B", "").await;
    let c = t.forge.open_issue(&t.repo, "reporter", "C", "").await;
    for issue in [&a, &b, &c] {
        t.forge.label(WRITER, issue, TRIGGER).await;
        t.app.wait_state(issue, Lifecycle::Pending).await;
    }
    t.forge.unlabel(WRITER, &a, TRIGGER).await;
    t.forge.set_state(WRITER, &b, "closed").await;
    t.app.wait_state(&a, Lifecycle::Cancelled).await;
    t.app.wait_state(&b, Lifecycle::Cancelled).await;

    // Removed while webhooks were lost: the scan notices the issue left the list.
    t.forge.webhooks_enabled(false);
    t.forge.unlabel(WRITER, &c, TRIGGER).await;
    assert_eq!(
        t.record(&c).await.expect("known").lifecycle,
        Lifecycle::Pending
    );
    t.scan().await;
    t.app.wait_state(&c, Lifecycle::Cancelled).await;
    t.assert_contract();
}

#[tokio::test]
async fn duplicate_and_out_of_order_deliveries_end_in_the_same_state() {
    let t = ForgeApp::spawn().await;
    t.forge.hold_webhooks(true);
    let issue = t.forge.open_issue(&t.repo, "reporter", "Shuffle", "").await;
    t.forge.label(WRITER, &issue, "bug").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.forge.comment(WRITER, &issue, "Some context.").await;
    let held = t.forge.take_webhooks();
    assert_eq!(held.len(), 4);
    // Newest first, then every one again (Replay sends a new delivery id).
    for out in held.iter().rev().chain(held.iter()) {
        let status = t.forge.send_webhook(out).await;
        assert!((200..300).contains(&status), "status {status}");
    }
    let record = t.app.wait_state(&issue, Lifecycle::Pending).await;
    assert_eq!(record.labels, vec!["bug".to_owned(), TRIGGER.to_owned()]);
    assert_eq!(record.trigger_actor.as_deref(), Some(WRITER));
    let (stored, pending) = t.app.store.delivery_counts().await.expect("count");
    assert_eq!(
        (stored, pending),
        (4, 0),
        "each distinct delivery stored once"
    );
    t.assert_contract();
}

#[tokio::test]
async fn the_bots_own_comments_and_labels_come_back_and_are_ignored() {
    let t = ForgeApp::spawn().await;
    let issue = t.forge.open_issue(&t.repo, READER, "Echo", "").await;
    t.forge.label(READER, &issue, TRIGGER).await;
    // The explanation the bot posts is echoed by the forge as an issue_comment webhook.
    t.app
        .wait_for_metric(
            r#"director_webhook_deliveries_total{event="issue_comment",outcome="own_event"} 1"#,
        )
        .await;
    let (stored, _) = t.app.store.delivery_counts().await.expect("count");
    assert_eq!(stored, 2, "opened + label_updated; the echo is not stored");
    t.assert_contract();
}

#[tokio::test]
async fn a_repository_without_the_trigger_label_picks_nothing_up() {
    let t = ForgeApp::spawn_with(|s| {
        s.scan.repos.push("acme/unlabelled".parse().expect("repo"));
    })
    .await;
    let bare = t.forge.add_repo("acme/unlabelled");
    t.forge.grant(&bare, BOT, Permission::Admin);
    t.forge.define_label(&bare, "bug");
    t.forge.webhooks_enabled(false);
    let one = t.forge.open_issue(&bare, "reporter", "Unrelated", "").await;
    t.forge.label(WRITER, &one, "bug").await;
    t.forge
        .open_issue(&bare, "reporter", "Also unrelated", "")
        .await;
    let report = t.scan().await;
    assert_eq!(
        report.repos_without_trigger_label,
        vec!["acme/unlabelled".to_owned()]
    );
    assert_eq!(report.labelled, 0);
    assert!(t.app.store.list_issues().await.expect("list").is_empty());
    t.assert_contract();
}

#[tokio::test]
async fn two_hundred_labelled_issues_across_pages_are_all_found_with_the_expected_calls() {
    let t = ForgeApp::spawn().await;
    t.forge.webhooks_enabled(false);
    let mut issues = Vec::new();
    for n in 0..200 {
        let issue = t
            .forge
            .open_issue(&t.repo, "reporter", &format!("Task {n}"), "")
            .await;
        t.forge.label(WRITER, &issue, TRIGGER).await;
        issues.push(issue);
    }
    t.forge.clear_calls();
    let report = t.scan().await;
    assert_eq!(report.labelled, 200);
    assert_eq!(report.queued, 200);
    for issue in &issues {
        assert_eq!(
            t.record(issue).await.expect("recorded").lifecycle,
            Lifecycle::Pending,
            "{issue}"
        );
    }
    assert_eq!(
        t.calls_to("GET", "/repos/acme/widgets/issues"),
        4,
        "200 issues = 4 pages of 50"
    );
    assert_eq!(
        t.calls_to("GET", "/timeline"),
        200,
        "one timeline read per new issue"
    );
    assert!(
        t.calls_to("GET", "/permission") <= 2,
        "the writer's permission is asked once per batch"
    );
    let pages: Vec<String> = t
        .forge
        .calls()
        .iter()
        .filter(|c| c.path.ends_with("/issues"))
        .map(|c| {
            c.query
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&")
        })
        .collect();
    assert!(
        pages.iter().all(|q| q.contains("limit=50")
            && q.contains("type=issues")
            && q.contains("labels=headless")),
        "{pages:?}"
    );

    // Nothing changed: a steady-state scan lists and does nothing else.
    t.forge.clear_calls();
    let again = t.scan().await;
    assert_eq!(again.queued, 0);
    assert_eq!(
        t.forge.calls().len(),
        4,
        "{:#?}",
        t.forge.calls().iter().map(|c| &c.path).collect::<Vec<_>>()
    );
    t.assert_contract();
}

#[tokio::test]
async fn the_forge_answering_500_twice_is_retried_and_nothing_is_lost() {
    let t = ForgeApp::spawn().await;
    t.forge.webhooks_enabled(false);
    let issue = t.forge.open_issue(&t.repo, "reporter", "Flaky", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.forge.clear_calls();
    t.forge.fail_next(&[500, 500]);
    let report = t.scan().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.labelled, 1);
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    let statuses: Vec<u16> = t.forge.calls().iter().take(3).map(|c| c.status).collect();
    assert_eq!(statuses, vec![500, 500, 200]);
    t.app.wait_for_metric(
        r#"director_forge_requests_total{endpoint="/repos/{owner}/{repo}/issues",status="500"} 2"#,
    )
    .await;
    let metrics = t.app.get("/metrics").await.text().await.expect("body");
    assert!(
        !metrics.contains("/issues/1"),
        "endpoints are templates, never issue numbers"
    );
    t.assert_contract();
}

#[tokio::test]
async fn status_prints_the_tracked_issues_as_json() {
    let t = ForgeApp::spawn().await;
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Status me", "")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["status", "--json"])
        .env("DIRECTOR_STORE__URL", t.app.db_url())
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = rows.as_array().expect("array");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["repo"], "acme/widgets");
    assert_eq!(rows[0]["number"], issue.number);
    assert_eq!(rows[0]["state"], "pending");
    assert_eq!(rows[0]["trigger_actor"], WRITER);
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_director"))
        .args(["status"])
        .env("DIRECTOR_STORE__URL", t.app.db_url())
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("acme/widgets#1") && text.contains("pending") && text.contains(WRITER),
        "{text}"
    );
}

#[tokio::test]
async fn a_readers_trigger_is_not_credited_to_a_writers_later_unrelated_label() {
    let t = ForgeApp::spawn().await;
    let issue = t.forge.open_issue(&t.repo, READER, "Sneaky", "").await;
    // The reader's label change is delivered late (or lost); the writer's arrives first and
    // its snapshot already carries the trigger.
    t.forge.hold_webhooks(true);
    t.forge.label(READER, &issue, TRIGGER).await;
    let readers = t.forge.take_webhooks();
    t.forge.label(WRITER, &issue, "bug").await;
    let writers = t.forge.take_webhooks();
    t.forge.hold_webhooks(false);
    for out in writers.iter().chain(readers.iter()) {
        t.forge.send_webhook(out).await;
    }
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("known");
    assert_eq!(record.lifecycle, Lifecycle::Untracked, "{record:?}");
    assert_eq!(record.trigger_actor.as_deref(), Some(READER));
    assert_eq!(record.trigger_trusted, Some(false));
    t.assert_contract();
}

#[tokio::test]
async fn closing_and_reopening_by_the_author_never_revives_the_issue() {
    let (t, llm) = ForgeApp::spawn_with_llm(|_| {}).await;
    llm.always("Fine.\n\nGO");
    let issue = t.forge.open_issue(&t.repo, READER, "Revive me", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Queued).await;
    t.forge.set_state(READER, &issue, "closed").await;
    t.app.wait_state(&issue, Lifecycle::Cancelled).await;
    t.forge.set_state(READER, &issue, "open").await;
    t.app.wait_processed().await;
    let record = t.record(&issue).await.expect("known");
    assert_eq!(
        record.lifecycle,
        Lifecycle::Cancelled,
        "reopening revived it"
    );
    assert_eq!(llm.prompts().len(), 1, "nothing was read again");
    // A writer applying the trigger again hands it over afresh.
    t.forge.unlabel(WRITER, &issue, TRIGGER).await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Queued).await;
    t.assert_contract();
}

#[tokio::test]
async fn one_issue_has_one_record_however_its_repository_is_spelled() {
    // The operator spells the repository unlike the forge; webhooks and the scan must still
    // meet on one record (two would mean two pre-flights, two runs, two pull requests).
    let t = ForgeApp::spawn_with(|s| {
        s.scan.repos = vec!["Acme/Widgets".parse().expect("repo")];
    })
    .await;
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Spelled twice", "")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    t.scan().await;
    t.app.wait_processed().await;
    let shouted: director::domain::RepoName = "ACME/WIDGETS".parse().expect("repo");
    let records = t.app.store.issues_in_repo(&shouted).await.expect("records");
    assert_eq!(records.len(), 1, "{records:#?}");
    t.assert_contract();
}
