//! The incremental scan against FakeForge, whose issue search follows Forgejo's semantics
//! (`labels` any of the names, `since` updated at or after, `X-Total-Count`): what changed
//! is found with one question across every repository; what did not costs nothing more.

use director::domain::Lifecycle;
use director::forge::Permission;

use crate::forge_helpers::{ForgeApp, TRIGGER, WRITER};
use crate::helpers::wait_until;

fn searches(t: &ForgeApp) -> usize {
    t.forge
        .calls()
        .iter()
        .filter(|c| c.path == "/api/v1/repos/issues/search")
        .count()
}

fn repo_lists(t: &ForgeApp) -> usize {
    t.forge
        .calls()
        .iter()
        .filter(|c| {
            c.method == "GET" && c.path.ends_with("/issues") && c.path.contains("/repos/acme/")
        })
        .count()
}

#[tokio::test]
async fn a_label_applied_without_a_webhook_is_found_by_the_next_incremental_pass() {
    let t = ForgeApp::spawn().await;
    t.scan().await;
    t.forge.webhooks_enabled(false);
    let issue = t.forge.open_issue(&t.repo, "reporter", "Missed", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    assert!(t.record(&issue).await.is_none(), "no webhook arrived");

    t.forge.clear_calls();
    let report = t.scan_incremental().await;
    assert_eq!(report.pass, "incremental");
    assert_eq!((report.labelled, report.queued), (1, 1), "{report:?}");
    let record = t.app.wait_state(&issue, Lifecycle::Pending).await;
    assert_eq!(record.trigger_actor.as_deref(), Some(WRITER));
    assert_eq!(searches(&t), 1);
    assert_eq!(repo_lists(&t), 0, "no per-repository listing");
    let search = t
        .forge
        .calls()
        .into_iter()
        .find(|c| c.path == "/api/v1/repos/issues/search")
        .expect("a search");
    let q = |k: &str| {
        search
            .query
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(q("type").as_deref(), Some("issues"));
    assert_eq!(
        q("state").as_deref(),
        Some("all"),
        "closed issues are seen too"
    );
    assert!(q("since").is_some());
    t.assert_contract();
}

#[tokio::test]
async fn a_label_removed_without_a_webhook_is_noticed() {
    let t = ForgeApp::spawn().await;
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Soon gone", "")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    t.scan().await;
    t.forge.webhooks_enabled(false);
    t.forge.unlabel(WRITER, &issue, TRIGGER).await;
    assert!(t.record(&issue).await.expect("known").trigger_present);

    let report = t.scan_incremental().await;
    assert_eq!(report.queued, 1, "{report:?}");
    let record = t.app.wait_state(&issue, Lifecycle::Cancelled).await;
    assert!(!record.trigger_present);
}

#[tokio::test]
async fn a_closed_issue_without_a_webhook_is_noticed() {
    let t = ForgeApp::spawn().await;
    let issue = t
        .forge
        .open_issue(&t.repo, "reporter", "Soon closed", "")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    t.scan().await;
    t.forge.webhooks_enabled(false);
    t.forge.set_state(WRITER, &issue, "closed").await;
    t.scan_incremental().await;
    t.app.wait_state(&issue, Lifecycle::Cancelled).await;
}

#[tokio::test]
async fn a_repository_outside_the_watched_set_is_never_queued() {
    let t = ForgeApp::spawn().await;
    let elsewhere = t.forge.add_repo("acme/unwatched");
    t.forge.grant(&elsewhere, WRITER, Permission::Write);
    t.forge.define_label(&elsewhere, TRIGGER);
    t.scan().await;
    t.forge.webhooks_enabled(false);
    let issue = t
        .forge
        .open_issue(&elsewhere, "reporter", "Not ours", "")
        .await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    let report = t.scan_incremental().await;
    assert_eq!(report.queued, 0, "{report:?}");
    assert!(t.record(&issue).await.is_none(), "never recorded");
}

#[tokio::test]
async fn with_nothing_changed_a_pass_costs_one_request_and_queues_nothing() {
    let t = ForgeApp::spawn().await;
    let issue = t.forge.open_issue(&t.repo, "reporter", "Known", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    t.app.wait_state(&issue, Lifecycle::Pending).await;
    t.scan().await;
    t.forge.clear_calls();
    for _ in 0..2 {
        let report = t.scan_incremental().await;
        // The overlap window sees the known issue again; its `updated_at` is unchanged.
        assert_eq!(report.queued, 0, "{report:?}");
    }
    assert_eq!(t.forge.calls().len(), 2, "{:?}", t.forge.calls());
}

#[tokio::test]
async fn before_any_full_pass_the_incremental_pass_runs_a_full_one() {
    let t = ForgeApp::spawn().await;
    t.forge.clear_calls();
    let report = t.scan_incremental().await;
    assert_eq!(report.pass, "full");
    assert_eq!(searches(&t), 0);
}

#[tokio::test]
async fn the_schedules_run_each_pass_and_a_full_pass_at_start_up() {
    // The incremental pass every second, the full pass never (1 January only): after the
    // start-up full pass, only searches.
    let t = ForgeApp::spawn_with(|s| {
        s.scan.enabled = true;
        s.scan.schedule = "* * * * * *".into();
        s.scan.full_schedule = "0 0 0 1 1 *".into();
    })
    .await;
    wait_until("two incremental passes", || async { searches(&t) >= 2 }).await;
    assert_eq!(repo_lists(&t), 1, "one full pass, at start-up");

    // The full pass every second: the repository is listed again on its schedule.
    let t = ForgeApp::spawn_with(|s| {
        s.scan.enabled = true;
        s.scan.schedule = "0 0 0 1 1 *".into();
        s.scan.full_schedule = "* * * * * *".into();
    })
    .await;
    // The schedule drives the scan, not an event: polled.
    wait_until("a scheduled full pass", || async { repo_lists(&t) >= 2 }).await;
    assert_eq!(searches(&t), 0);
}

#[tokio::test]
async fn the_fakes_issue_search_follows_forgejo() {
    let t = ForgeApp::spawn().await;
    t.forge.define_label(&t.repo, "docs");
    let a = t.forge.open_issue(&t.repo, "reporter", "A", "").await;
    let b = t.forge.open_issue(&t.repo, "reporter", "B", "").await;
    let c = t.forge.open_issue(&t.repo, "reporter", "C", "").await;
    t.forge.label(WRITER, &a, TRIGGER).await;
    t.forge.label(WRITER, &b, "docs").await;
    let search = |query: Vec<(&'static str, String)>| {
        let url = format!("{}/api/v1/repos/issues/search", t.forge_url());
        async move {
            let resp = crate::helpers::http_client()
                .get(url)
                .query(&query)
                .header(
                    "Authorization",
                    format!("token {}", crate::forge_helpers::BOT_TOKEN),
                )
                .send()
                .await
                .expect("search");
            let total: usize = resp.headers()["x-total-count"]
                .to_str()
                .expect("header")
                .parse()
                .expect("number");
            let body: serde_json::Value = resp.json().await.expect("JSON");
            let numbers: Vec<u64> = body
                .as_array()
                .expect("array")
                .iter()
                .map(|i| i["number"].as_u64().expect("number"))
                .collect();
            (total, numbers)
        }
    };
    // `labels`: any of the names; a name no repository defines is dropped.
    let (total, mut found) = search(vec![
        ("type", "issues".into()),
        ("labels", format!("{TRIGGER},docs,nonexistent")),
    ])
    .await;
    found.sort();
    assert_eq!((total, found), (2, vec![a.number, b.number]));
    // `since`: updated at or after. The newest change is b's label.
    let b_updated = t.forge.issue_updated_at(&b).expect("b");
    let (_, found) = search(vec![("type", "issues".into()), ("since", b_updated)]).await;
    assert_eq!(found, vec![b.number]);
    // Pages: `limit` per page, `X-Total-Count` the whole.
    let (total, found) = search(vec![
        ("type", "issues".into()),
        ("limit", "2".into()),
        ("page", "2".into()),
    ])
    .await;
    assert_eq!(total, 3);
    assert_eq!(found.len(), 1, "{found:?}");
    let _ = c;
    t.assert_contract();
}

#[tokio::test]
async fn the_directors_own_state_labels_are_not_observed_again() {
    let (t, llm) = ForgeApp::spawn_with_llm(|_| {}).await;
    llm.always("Fine.\n\nGO");
    t.forge.webhooks_enabled(false);
    let issue = t.forge.open_issue(&t.repo, "reporter", "Known", "").await;
    t.forge.label(WRITER, &issue, TRIGGER).await;
    // The pass picks it up; its read says GO and the director puts its `queued` label on,
    // which moves the issue's `updated_at` past what the pass recorded.
    t.scan().await;
    t.app.wait_state(&issue, Lifecycle::Queued).await;
    wait_until("the queued label is on", || async {
        t.forge
            .labels_on(&issue)
            .iter()
            .any(|l| l == "headless:queued")
    })
    .await;
    t.app.wait_processed().await;
    let report = t.scan_incremental().await;
    assert_eq!(
        report.queued, 0,
        "its own change, observed again: {report:?}"
    );
    // Anyone else's label is a change.
    t.forge.define_label(&t.repo, "bug");
    t.forge.label(WRITER, &issue, "bug").await;
    let report = t.scan_incremental().await;
    assert_eq!(report.queued, 1, "{report:?}");
}
