//! Every run's transcript: its whole output, redacted, kept as it arrives and served at
//! `/runs/{id}` and `/runs/{id}/log` under the status page's visibility rule. On the
//! in-memory FakeRuntime, whose container prints when a test says so.

use director::domain::{IssueRef, Lifecycle};
use director::settings::Secret;

use crate::fake_runs::{env, labelled, spawn};
use crate::forge_helpers::ForgeApp;
use crate::helpers::{http_client, wait_until};

const TOKEN: &str = "status-token-9d21";

async fn get(t: &ForgeApp, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut req = http_client().get(format!("{}{path}", t.app.address));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.expect("the director answers");
    let status = resp.status().as_u16();
    let kind = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, kind, resp.text().await.unwrap_or_default())
}

async fn running(t: &ForgeApp) -> (IssueRef, director::domain::RunId) {
    let issue = labelled(t, "Think out loud", "mode: hang").await;
    t.app.wait_state(&issue, Lifecycle::Running).await;
    let id = crate::fake_runs::run_ids(t, &issue)
        .await
        .pop()
        .expect("a run");
    (issue, id)
}

/// Waits until the run's kept transcript holds `text`.
async fn kept(t: &ForgeApp, id: &director::domain::RunId, text: &str) {
    wait_until("the output is kept", || async {
        t.app
            .store
            .transcript(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|tr| tr.text.contains(text))
    })
    .await;
}

#[tokio::test]
async fn a_runs_output_is_served_redacted_while_it_runs_and_after() {
    let (t, _llm, fake) = spawn(|s| s.server.transcripts_public = true).await;
    let (issue, id) = running(&t).await;
    let token = env(&fake.spec_of(&id).expect("spec"), "DIRECTOR_TOKEN").to_owned();
    assert!(token.len() > 8, "the run was given a token");
    fake.print(
        &id,
        &format!("hello transcript\nmy token is {token}\n<script>alert(1)</script>\n\u{1b}[31mred\u{1b}[0m\n"),
    );
    let log_path = format!("/runs/{id}/log");
    wait_until("the output is served while the run runs", || async {
        get(&t, &log_path, None)
            .await
            .2
            .contains("hello transcript")
    })
    .await;
    let (status, kind, log) = get(&t, &log_path, None).await;
    assert_eq!(status, 200);
    assert!(kind.starts_with("text/plain"), "{kind}");
    assert!(!log.contains(&token), "redacted: {log}");
    assert!(log.contains("my token is [redacted]"), "{log}");
    let (status, kind, page) = get(&t, &format!("/runs/{id}"), None).await;
    assert_eq!(status, 200);
    assert!(kind.starts_with("text/html"), "{kind}");
    assert!(page.contains("hello transcript"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>") && !page.contains('\u{1b}'),
        "{page}"
    );
    assert!(
        page.contains("␛[31mred"),
        "escapes shown, not acted on: {page}"
    );
    assert!(
        page.contains("http-equiv=\"refresh\""),
        "refreshed while live"
    );
    assert!(!page.contains(&token));

    fake.exit(&id, 1, "last words\n");
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let (_, _, log) = get(&t, &log_path, None).await;
    assert!(
        log.contains("hello transcript") && log.contains("last words"),
        "the whole output, in order: {log}"
    );
    assert_eq!(log.matches("hello transcript").count(), 1, "{log}");
    let (_, _, page) = get(&t, &format!("/runs/{id}"), None).await;
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "not refreshed once ended"
    );
    let (_, _, status_page) = get(&t, "/status", None).await;
    assert!(
        status_page.contains(&format!("<a href=\"runs/{id}\">")),
        "the status page links the run"
    );
    assert_eq!(get(&t, "/runs/0123456789ab", None).await.0, 404);
    assert_eq!(get(&t, "/runs/..%2F..%2Fetc/log", None).await.0, 404);
    // Only the id itself names the run: not in capitals, not with more before or after it.
    let upper = id.as_str().to_uppercase();
    if upper != id.as_str() {
        assert_eq!(get(&t, &format!("/runs/{upper}"), None).await.0, 404);
    }
    assert_eq!(get(&t, &format!("/runs/0{id}"), None).await.0, 404);
    assert_eq!(get(&t, &format!("/runs/{id}%00"), None).await.0, 404);
}

#[tokio::test]
async fn a_private_repositorys_run_is_shown_only_with_the_status_token() {
    let (t, _llm, fake) = spawn(|s| {
        s.status.token = Secret::new(TOKEN);
        s.server.transcripts_public = true;
    })
    .await;
    t.forge.make_private(&t.repo);
    let (_, id) = running(&t).await;
    fake.print(&id, "private work\n");
    kept(&t, &id, "private work").await;
    for path in [format!("/runs/{id}"), format!("/runs/{id}/log")] {
        assert_eq!(
            get(&t, &path, None).await.0,
            404,
            "{path} without the token"
        );
        let (status, _, body) = get(&t, &path, Some(TOKEN)).await;
        assert_eq!(status, 200, "{path} with the token");
        assert!(body.contains("private work"));
        assert_eq!(get(&t, &path, Some("wrong")).await.0, 401);
    }
}

#[tokio::test]
async fn a_transcript_past_its_cap_keeps_the_end_and_says_what_was_cut() {
    let (t, _llm, fake) = spawn(|s| {
        s.runner.transcript_max_mb = 1;
        s.server.transcripts_public = true;
    })
    .await;
    let (issue, id) = running(&t).await;
    let line = format!("{}\n", "x".repeat(99));
    let first = format!("FIRST LINE\n{}", line.repeat(12_000));
    fake.print(&id, &first);
    fake.exit(&id, 1, "THE END\n");
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let kept = t
        .app
        .store
        .transcript(&id)
        .await
        .expect("store")
        .expect("a transcript");
    assert!(kept.bytes <= 1024 * 1024, "{}", kept.bytes);
    assert!(kept.dropped_bytes > 0);
    assert_eq!(
        kept.bytes + kept.dropped_bytes,
        (first.len() + "THE END\n".len()) as u64
    );
    assert!(kept.text.ends_with("THE END\n"));
    assert!(!kept.text.contains("FIRST LINE"));
    let (_, _, log) = get(&t, &format!("/runs/{id}/log"), None).await;
    assert!(
        log.starts_with(&format!(
            "[director: the first {} bytes were dropped at runner.transcript_max_mb]\n",
            kept.dropped_bytes
        )),
        "{}",
        &log[..200]
    );
}

#[tokio::test]
async fn with_a_public_url_the_report_and_the_pull_request_link_the_runs_page() {
    let (t, _llm, _fake) =
        spawn(|s| s.server.public_url = "https://director.example.org/".into()).await;
    let issue = labelled(&t, "Add --verbose", "Print each step.").await;
    t.app.wait_state(&issue, Lifecycle::Succeeded).await;
    let id = crate::fake_runs::run_ids(&t, &issue)
        .await
        .pop()
        .expect("a run");
    let link = format!("(https://director.example.org/runs/{id})");
    let pulls = t.forge.pulls_of(&t.repo);
    assert!(pulls[0].4.contains(&link), "{}", pulls[0].4);
    let reports = crate::fake_runs::reports(&t, &issue);
    assert!(reports[0].contains(&link), "{}", reports[0]);
}

#[tokio::test]
async fn in_a_browser_the_runs_page_shows_a_hostile_transcript_as_text() {
    let (t, _llm, fake) = spawn(|s| s.server.transcripts_public = true).await;
    let (issue, id) = running(&t).await;
    fake.exit(
        &id,
        1,
        "<img src=x onerror=\"document.title='pwned'\"><b>bold</b>\nplain words\n",
    );
    t.app.wait_state(&issue, Lifecycle::Failed).await;
    let dom = crate::status_page::chromium(&format!("{}/runs/{id}", t.app.address), None).await;
    assert!(dom.contains("plain words"), "{dom}");
    assert!(
        dom.contains("&lt;img src=x onerror=\"document.title='pwned'\"&gt;&lt;b&gt;bold&lt;/b&gt;"),
        "shown as text: {dom}"
    );
    assert!(!dom.contains("<img") && !dom.contains("<b>"), "{dom}");
    assert!(!dom.contains("pwned</title>"), "no script ran: {dom}");
    assert!(!dom.contains("<script"), "{dom}");
}

#[tokio::test]
async fn by_default_a_public_repositorys_transcript_needs_the_status_token() {
    // Redaction is of literal values: an agent that prints a secret reversed publishes it.
    // So no transcript is served to anyone without the token unless the operator says so.
    let (t, _llm, fake) = spawn(|s| s.status.token = Secret::new(TOKEN)).await;
    let (_, id) = running(&t).await;
    fake.print(&id, "terces-a-si-siht\n");
    kept(&t, &id, "terces").await;
    for path in [format!("/runs/{id}"), format!("/runs/{id}/log")] {
        let (status, _, body) = get(&t, &path, None).await;
        assert_eq!(status, 401, "{path} without the token");
        assert!(body.contains("server.transcripts_public"), "{body}");
        assert!(!body.contains("terces"), "{body}");
        let (status, _, body) = get(&t, &path, Some(TOKEN)).await;
        assert_eq!(status, 200, "{path} with the token");
        assert!(body.contains("terces-a-si-siht"));
    }
}
