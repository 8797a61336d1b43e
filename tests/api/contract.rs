//! The real Forgejo client against the FakeForge over HTTP: every call the director makes,
//! each checked against Forgejo's API spec, plus the client's error and retry behaviour.

use std::time::Duration;

use director::domain::IssueRef;
use director::forge::forgejo::ForgejoClient;
use director::forge::{Forge, ForgeError, Permission};
use director::settings::{ForgeSettings, Secret};
use director_testkit::forge::FakeForge;

use crate::forge_helpers::{BOT, BOT_TOKEN, READER, TRIGGER, WRITER};
use crate::helpers::http_client;

fn client(url: &str, token: &str) -> ForgejoClient {
    let _ = http_client();
    let settings = ForgeSettings {
        url: url.to_owned(),
        token: Secret::new(token),
        timeout_secs: 5,
        max_attempts: 3,
        ..ForgeSettings::default()
    };
    ForgejoClient::new(&settings, None)
        .expect("client")
        .with_backoff_base(Duration::from_millis(5))
}

#[tokio::test]
async fn every_client_call_fits_the_forgejo_api_spec() {
    let forge = FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let repo = forge.add_org_repo("acme", "widgets");
    forge.add_org_repo("acme", "gadgets");
    forge.grant(&repo, BOT, Permission::Admin);
    forge.grant(&repo, WRITER, Permission::Write);
    forge.add_user(READER);
    forge.define_label(&repo, TRIGGER);
    let issue = forge.open_issue(&repo, "reporter", "Title", "Body").await;
    forge.label(WRITER, &issue, TRIGGER).await;
    let server = forge.serve().expect("serves");
    let c = client(server.url(), BOT_TOKEN);

    assert_eq!(c.current_user().await.expect("user"), BOT);
    assert_eq!(
        c.repository(&repo).await.expect("repo").default_branch,
        "main"
    );
    let listed = c
        .open_issues_with_label(&repo, TRIGGER)
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].has_label(TRIGGER));
    let got = c.issue(&issue).await.expect("issue");
    assert_eq!(
        (got.title.as_str(), got.body.as_str(), got.author.as_str()),
        ("Title", "Body", "reporter")
    );
    let timeline = c.timeline(&issue).await.expect("timeline");
    assert!(timeline.iter().any(|t| t.kind == "label"
        && t.added
        && t.actor == WRITER
        && t.label.as_deref() == Some(TRIGGER)));
    assert_eq!(
        c.permission(&repo, WRITER).await.expect("perm"),
        Permission::Write
    );
    assert_eq!(
        c.permission(&repo, READER).await.expect("perm"),
        Permission::Read
    );
    assert_eq!(
        c.permission(&repo, "nobody-at-all").await.expect("perm"),
        Permission::None
    );
    let created = c
        .ensure_label(&repo, "headless:queued", "#0075ca", "Queued for a run")
        .await
        .expect("label");
    let again = c
        .ensure_label(&repo, "headless:queued", "#0075ca", "Queued for a run")
        .await
        .expect("label");
    assert_eq!(created.id, again.id, "ensure_label finds an existing label");
    c.add_label(&issue, created.id).await.expect("add");
    assert!(
        forge
            .labels_on(&issue)
            .contains(&"headless:queued".to_owned())
    );
    c.remove_label(&issue, created.id).await.expect("remove");
    c.remove_label(&issue, created.id)
        .await
        .expect("removing twice is fine");
    assert!(
        !forge
            .labels_on(&issue)
            .contains(&"headless:queued".to_owned())
    );
    let comment = c.create_comment(&issue, "hello").await.expect("comment");
    let edited = c
        .edit_comment(&repo, comment.id, "hello, edited")
        .await
        .expect("edit");
    assert_eq!(edited.body, "hello, edited");
    let comments = c.comments(&issue).await.expect("comments");
    assert_eq!(
        comments.last().map(|c| c.body.as_str()),
        Some("hello, edited")
    );
    let mut org = c.org_repos("acme").await.expect("org");
    org.sort();
    assert_eq!(
        org.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        vec!["acme/gadgets", "acme/widgets"]
    );

    assert!(forge.calls().len() >= 15);
    let v = forge.contract_violations();
    assert!(v.is_empty(), "{v:#?}");
}

#[tokio::test]
async fn errors_name_the_path_and_never_the_token() {
    let forge = FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    let server = forge.serve().expect("serves");
    let secret = "wrong-token-0123456789";
    let err = client(server.url(), secret)
        .repository(&repo)
        .await
        .expect_err("401");
    assert!(matches!(err, ForgeError::Unauthorized { .. }), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(text.contains("/repos/acme/widgets"), "{text}");
    assert!(!text.contains(secret), "{text}");

    let c = client(server.url(), BOT_TOKEN);
    let missing: IssueRef = "acme/widgets#99".parse().expect("ref");
    let err = c.issue(&missing).await.expect_err("404");
    assert!(err.is_not_found(), "{err:?}");
    assert!(!format!("{err:?}").contains(BOT_TOKEN));
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_up_to_the_limit() {
    let forge = FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    let server = forge.serve().expect("serves");
    let c = client(server.url(), BOT_TOKEN);

    forge.fail_next(&[429, 503]);
    assert!(c.repository(&repo).await.is_ok());
    assert_eq!(forge.calls().len(), 3);

    forge.clear_calls();
    forge.fail_next(&[500, 500, 500]);
    let err = c
        .repository(&repo)
        .await
        .expect_err("gives up after max_attempts");
    assert!(
        matches!(err, ForgeError::Status { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(forge.calls().len(), 3);

    // A POST that may have taken effect (500) is not repeated; one that surely did not (503) is.
    let issue = forge.open_issue(&repo, "reporter", "x", "").await;
    forge.clear_calls();
    forge.fail_next(&[500]);
    assert!(c.create_comment(&issue, "once").await.is_err());
    assert_eq!(forge.calls().len(), 1);
    forge.clear_calls();
    forge.fail_next(&[503]);
    assert!(c.create_comment(&issue, "once").await.is_ok());
    assert_eq!(forge.comments_on(&issue).len(), 1);
}

#[tokio::test]
async fn the_label_filter_quirk_is_reproduced() {
    // Forgejo drops unknown label names from the filter and returns every open issue.
    let forge = FakeForge::new();
    forge.add_account(BOT, BOT_TOKEN);
    let repo = forge.add_repo("acme/widgets");
    forge.open_issue(&repo, "reporter", "a", "").await;
    forge.open_issue(&repo, "reporter", "b", "").await;
    let server = forge.serve().expect("serves");
    let listed = client(server.url(), BOT_TOKEN)
        .open_issues_with_label(&repo, "headless")
        .await
        .expect("list");
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|i| !i.has_label("headless")));
}
