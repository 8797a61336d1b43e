//! `POST /webhooks/forgejo` end to end: signatures, limits, parsing, deduplication, ordering.

use director::forge::signature::sign;

use crate::helpers::{
    BOT, Issue, SECRET, TestApp, comment_payload, fixture, issue_payload, wait_until,
};

#[tokio::test]
async fn a_signed_issue_event_is_stored_then_recorded() {
    let app = TestApp::spawn().await;
    let body = issue_payload(
        "label_updated",
        "alice",
        &Issue {
            labels: &["headless", "bug"],
            ..Issue::default()
        },
    );
    let res = app.deliver("issue_label", "d-1", &body).await;
    assert_eq!(res.status(), 202);
    assert_eq!(app.stored_deliveries().await, 1);
    app.wait_processed().await;
    let issue = app
        .store
        .issue(&"acme/widgets#7".parse().expect("ref"))
        .await
        .expect("query")
        .expect("issue recorded");
    assert_eq!(issue.title, "Add a --verbose flag");
    assert_eq!(issue.state, "open");
    assert_eq!(issue.labels, vec!["bug".to_owned(), "headless".to_owned()]);
}

#[tokio::test]
async fn each_signature_header_family_is_accepted() {
    let app = TestApp::spawn().await;
    type Format = fn(&str) -> String;
    let cases: [(&str, Format); 3] = [
        ("X-Forgejo-Signature", |s| s.to_owned()),
        ("X-Gitea-Signature", |s| s.to_owned()),
        ("X-Hub-Signature-256", |s| format!("sha256={s}")),
    ];
    for (n, (header, value)) in cases.into_iter().enumerate() {
        let body = issue_payload(
            "opened",
            "alice",
            &Issue {
                number: 10 + n as u64,
                ..Issue::default()
            },
        );
        let sig = value(&sign(SECRET, body.as_bytes()));
        let delivery = format!("family-{n}");
        let res = app
            .post_webhook(
                &[
                    ("X-Gitea-Event-Type", "issues"),
                    ("X-Gitea-Delivery", &delivery),
                    (header, &sig),
                ],
                &body,
            )
            .await;
        assert_eq!(res.status(), 202, "{header}");
    }
    assert_eq!(app.stored_deliveries().await, 3);
}

#[tokio::test]
async fn bad_signatures_get_401_and_store_nothing() {
    let app = TestApp::spawn().await;
    let body = issue_payload("opened", "alice", &Issue::default());
    let wrong = sign("some-other-secret", body.as_bytes());
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("X-Forgejo-Signature", ""), ("X-Gitea-Signature", "")],
        vec![("X-Forgejo-Signature", &wrong)],
        vec![("X-Hub-Signature-256", "sha256=00")],
        vec![("X-Forgejo-Signature", "not hex at all")],
    ];
    for headers in cases {
        let mut all = vec![
            ("X-Forgejo-Event-Type", "issues"),
            ("X-Forgejo-Delivery", "d-bad"),
        ];
        all.extend(headers.iter().copied());
        let res = app.post_webhook(&all, &body).await;
        assert_eq!(res.status(), 401, "headers {headers:?}");
    }
    assert_eq!(app.stored_deliveries().await, 0);
}

#[tokio::test]
async fn any_secret_in_rotation_is_accepted() {
    let app = TestApp::spawn_with(|s| {
        s.webhook.secrets = vec![
            director::settings::Secret::new("old-secret"),
            director::settings::Secret::new("new-secret"),
        ];
    })
    .await;
    for (n, secret) in ["old-secret", "new-secret"].iter().enumerate() {
        let body = issue_payload(
            "opened",
            "alice",
            &Issue {
                number: 1 + n as u64,
                ..Issue::default()
            },
        );
        let sig = sign(secret, body.as_bytes());
        let id = format!("rot-{n}");
        let res = app
            .post_webhook(
                &[
                    ("X-Forgejo-Event-Type", "issues"),
                    ("X-Forgejo-Delivery", &id),
                    ("X-Forgejo-Signature", &sig),
                ],
                &body,
            )
            .await;
        assert_eq!(res.status(), 202, "{secret}");
    }
    let body = issue_payload(
        "opened",
        "alice",
        &Issue {
            number: 9,
            ..Issue::default()
        },
    );
    let sig = sign(SECRET, body.as_bytes());
    let res = app
        .post_webhook(
            &[
                ("X-Forgejo-Event-Type", "issues"),
                ("X-Forgejo-Signature", &sig),
            ],
            &body,
        )
        .await;
    assert_eq!(
        res.status(),
        401,
        "a secret no longer configured must be refused"
    );
    assert_eq!(app.stored_deliveries().await, 2);
}

#[tokio::test]
async fn an_oversized_body_gets_413_and_stores_nothing() {
    let app = TestApp::spawn_with(|s| s.server.max_body_bytes = 4096).await;
    let big = "x".repeat(5000);
    let body = issue_payload(
        "opened",
        "alice",
        &Issue {
            body: &big,
            ..Issue::default()
        },
    );
    let res = app.deliver("issues", "d-big", &body).await;
    assert_eq!(res.status(), 413);
    assert_eq!(app.stored_deliveries().await, 0);
}

#[tokio::test]
async fn signed_but_malformed_bodies_get_400_with_a_reason() {
    let app = TestApp::spawn().await;
    let no_issue = r#"{"action": "opened", "repository": {"full_name": "acme/widgets"}, "sender": {"login": "alice"}}"#;
    let no_sender =
        issue_payload("opened", "alice", &Issue::default()).replace("\"sender\"", "\"someone\"");
    let bad_repo = issue_payload("opened", "alice", &Issue::default())
        .replace("\"acme/widgets\"", "\"acme widgets\"");
    for (n, (body, reason)) in [
        ("{not json", "not valid JSON"),
        ("[]", "not valid JSON"),
        (no_issue, "no `issue`"),
        (no_sender.as_str(), "sender.login"),
        (bad_repo.as_str(), "repository.full_name"),
    ]
    .into_iter()
    .enumerate()
    {
        let res = app.deliver("issues", &format!("m-{n}"), body).await;
        assert_eq!(res.status(), 400, "{body}");
        let text = res.text().await.expect("body");
        assert!(text.contains(reason), "reason for {body:?}: {text}");
        assert!(!text.contains('\n'), "one-line reason: {text}");
    }
    assert_eq!(app.stored_deliveries().await, 0);
}

/// An issue number past what the database holds, signed (a holder of the secret, or a forge
/// bug), is that delivery's 400: deliveries sent beside it, perhaps stored in the same batch,
/// are not failed.
#[tokio::test]
async fn an_issue_number_out_of_range_is_refused_alone() {
    let app = TestApp::spawn().await;
    let opened = |number: u64| {
        issue_payload(
            "opened",
            "alice",
            &Issue {
                number,
                ..Issue::default()
            },
        )
    };
    let (one, huge, two) = (opened(1), opened(i64::MAX.unsigned_abs() + 1), opened(2));
    let (first, bad, second) = tokio::join!(
        app.deliver("issues", "range-1", &one),
        app.deliver("issues", "range-huge", &huge),
        app.deliver("issues", "range-2", &two),
    );
    assert_eq!(bad.status(), 400);
    let text = bad.text().await.expect("body");
    assert!(text.contains("out of range"), "{text}");
    assert_eq!(first.status(), 202);
    assert_eq!(second.status(), 202);
    assert_eq!(app.stored_deliveries().await, 2);
}

#[tokio::test]
async fn unused_event_types_get_200_and_store_nothing() {
    let app = TestApp::spawn().await;
    for (event, file) in [
        ("push", "HookPush.json"),
        ("release", "HookRelease.json"),
        ("create", "HookTag.json"),
        ("pull_request_label", "HookPullRequestLabelAdded.json"),
    ] {
        let res = app
            .deliver(event, &format!("u-{event}"), &fixture(file))
            .await;
        assert_eq!(res.status(), 200, "{event}");
    }
    assert_eq!(app.stored_deliveries().await, 0);
}

#[tokio::test]
async fn a_real_pull_request_payload_is_stored_but_tracks_no_issue() {
    let app = TestApp::spawn_with(|s| {
        s.scan
            .repos
            .push("anbraten/test-repo".parse().expect("repo"))
    })
    .await;
    let res = app
        .deliver(
            "pull_request",
            "pr-1",
            &fixture("HookPullRequestMerged.json"),
        )
        .await;
    assert_eq!(res.status(), 202);
    app.wait_processed().await;
    assert!(app.store.list_issues().await.expect("list").is_empty());
}

#[tokio::test]
async fn the_bots_own_events_are_ignored() {
    let app = TestApp::spawn().await;
    let body = issue_payload(
        "label_updated",
        BOT,
        &Issue {
            labels: &["headless"],
            ..Issue::default()
        },
    );
    let res = app.deliver("issue_label", "own-1", &body).await;
    assert_eq!(res.status(), 200);
    let comment = comment_payload("created", BOT, &Issue::default(), 5, "pre-flight: GO");
    let res = app.deliver("issue_comment", "own-2", &comment).await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.stored_deliveries().await, 0);
}

/// The body is what is deduplicated: the same delivery again is answered 200 `duplicate`;
/// another body under an id seen before (only a holder of the secret can sign one, and could
/// as well have used a new id) is another delivery.
#[tokio::test]
async fn a_delivery_sent_again_is_stored_once() {
    let app = TestApp::spawn().await;
    let body = issue_payload("opened", "alice", &Issue::default());
    assert_eq!(app.deliver("issues", "same-id", &body).await.status(), 202);
    let again = app.deliver("issues", "same-id", &body).await;
    assert_eq!(again.status(), 200);
    let answer: serde_json::Value = again.json().await.expect("json");
    assert_eq!(answer["status"], "duplicate", "{answer}");
    assert_eq!(app.stored_deliveries().await, 1);
    let other_body = issue_payload(
        "edited",
        "alice",
        &Issue {
            title: "changed",
            ..Issue::default()
        },
    );
    assert_eq!(
        app.deliver("issues", "same-id", &other_body).await.status(),
        202
    );
    assert_eq!(app.stored_deliveries().await, 2);
}

#[tokio::test]
async fn a_replay_under_a_new_id_is_stored_once() {
    let app = TestApp::spawn().await;
    let body = issue_payload("opened", "alice", &Issue::default());
    assert_eq!(
        app.deliver("issues", "first-uuid", &body).await.status(),
        202
    );
    let replay = app.deliver("issues", "replayed-uuid", &body).await;
    assert_eq!(replay.status(), 200);
    assert_eq!(app.stored_deliveries().await, 1);
}

#[tokio::test]
async fn many_concurrent_deliveries_are_all_stored() {
    let app = TestApp::spawn().await;
    let sends = (0..200u64).map(|n| {
        let body = issue_payload(
            "opened",
            "alice",
            &Issue {
                number: n + 1,
                ..Issue::default()
            },
        );
        let app = &app;
        async move {
            app.deliver("issues", &format!("c-{n}"), &body)
                .await
                .status()
        }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 202), "{statuses:?}");
    assert_eq!(app.stored_deliveries().await, 200);
    app.wait_processed().await;
    assert_eq!(app.store.list_issues().await.expect("list").len(), 200);
}

#[tokio::test]
async fn out_of_order_deliveries_end_in_the_newest_state() {
    let app = TestApp::spawn().await;
    let first = issue_payload(
        "label_updated",
        "alice",
        &Issue {
            labels: &["headless"],
            updated_at: "2026-11-30T10:00:00Z",
            ..Issue::default()
        },
    );
    let second = issue_payload(
        "label_updated",
        "alice",
        &Issue {
            labels: &["headless", "bug"],
            updated_at: "2026-11-30T10:00:03Z",
            ..Issue::default()
        },
    );
    let third = issue_payload(
        "closed",
        "alice",
        &Issue {
            labels: &["headless", "bug"],
            state: "closed",
            updated_at: "2026-11-30T10:00:09Z",
            ..Issue::default()
        },
    );
    // Newest first, oldest last.
    assert_eq!(app.deliver("issues", "o-3", &third).await.status(), 202);
    assert_eq!(
        app.deliver("issue_label", "o-1", &first).await.status(),
        202
    );
    assert_eq!(
        app.deliver("issue_label", "o-2", &second).await.status(),
        202
    );
    app.wait_processed().await;
    let issue = app
        .store
        .issue(&"acme/widgets#7".parse().expect("ref"))
        .await
        .expect("q")
        .expect("recorded");
    assert_eq!(issue.state, "closed");
    assert_eq!(issue.labels, vec!["bug".to_owned(), "headless".to_owned()]);
    assert_eq!(
        issue.forge_updated_at.as_deref(),
        Some("2026-11-30T10:00:09Z")
    );
}

#[tokio::test]
async fn probes_and_metrics_answer() {
    let app = TestApp::spawn().await;
    assert_eq!(app.get("/healthz").await.status(), 200);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.expect("json");
    assert_eq!(ready["database"], "ok");
    assert_eq!(ready["events_pending"], 0, "{ready}");
    assert_eq!(ready["actions_due"], 0, "{ready}");
    let body = issue_payload("opened", "alice", &Issue::default());
    app.deliver("issues", "m-1", &body).await;
    app.deliver("push", "m-2", &fixture("HookPush.json")).await;
    app.post_webhook(&[("X-Forgejo-Event-Type", "issues")], &body)
        .await;
    wait_until("metrics show the deliveries", || async {
        let text = app.get("/metrics").await.text().await.expect("body");
        text.contains(r#"director_webhook_deliveries_total{event="issues",outcome="accepted"} 1"#)
            && text.contains(r#"director_webhook_deliveries_total{event="other",outcome="ignored"} 1"#)
            && text.contains(r#"director_webhook_deliveries_total{event="issues",outcome="unauthorized"} 1"#)
            && text.contains(r#"director_http_request_duration_seconds_bucket{method="POST",route="/webhooks/forgejo""#)
            && text.contains("director_actions_due 0")
    })
    .await;
}

#[tokio::test]
async fn a_signed_delivery_for_a_repository_nobody_watches_is_ignored_and_counted() {
    let app = TestApp::spawn_with(|s| s.scan.orgs = vec!["Watched-Org".into()]).await;
    // Signed with the secret, for a repository the configuration does not name.
    let stranger = issue_payload(
        "label_updated",
        "mallory",
        &Issue {
            repo: "evil/elsewhere",
            labels: &["headless"],
            ..Default::default()
        },
    );
    let res = app.deliver("issue_label", "w-1", &stranger).await;
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["status"], "ignored", "{body}");
    // Watched: by name, and through its organisation (in any case).
    for (n, repo) in ["acme/widgets", "watched-org/tools"]
        .into_iter()
        .enumerate()
    {
        let ok = issue_payload(
            "label_updated",
            "alice",
            &Issue {
                repo,
                ..Default::default()
            },
        );
        let res = app.deliver("issue_label", &format!("w-ok-{n}"), &ok).await;
        assert_eq!(res.status(), 202, "{repo}");
    }
    app.wait_processed().await;
    assert_eq!(app.stored_deliveries().await, 2);
    let issues = app.store.list_issues().await.expect("list");
    assert!(
        issues.iter().all(|r| r.repo.owner() != "evil"),
        "{issues:?}"
    );
    let metrics = app.get("/metrics").await.text().await.expect("text");
    assert!(
        metrics.contains(
            r#"director_webhook_deliveries_total{event="issue_label",outcome="unwatched"} 1"#
        ),
        "{metrics}"
    );
}
